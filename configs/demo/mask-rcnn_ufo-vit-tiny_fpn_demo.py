# Mask R-CNN with a UFO-ViT-tiny backbone on the generated shapes dataset
# (python tools/generate_demo_data.py coco -> data/demo_coco/), trained from
# scratch on a CPU: the SOFT demo (mask-rcnn_soft-tiny_fpn_demo.py) with the
# backbone swapped. UFO-ViT-tiny (192 channels, 12 blocks at stride 16) gives
# four 192-channel maps at strides 4-32.
_base_ = ['./mask-rcnn_soft-tiny_fpn_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='UFOViT',
        arch='tiny',
        drop_path_rate=0.05,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=[192] * 4))
