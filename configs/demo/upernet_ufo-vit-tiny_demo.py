# The UperNet demo (upernet_soft-tiny_demo.py) with UFO-ViT-tiny as the
# backbone: four 192-channel maps at strides 4-32, stochastic depth 0.05 as
# in the UFO-ViT Mask R-CNN demo. Data, heads, schedule, optimiser and seed
# are the demo's. One of the segmentors tools/analysis/compare_backbones.py
# trains side by side.
_base_ = ['./upernet_soft-tiny_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='UFOViT',
        arch='tiny',
        drop_path_rate=0.05,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    decode_head=dict(in_channels=[192] * 4),
    auxiliary_head=dict(in_channels=192))
