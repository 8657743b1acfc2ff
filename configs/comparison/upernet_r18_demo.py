# A peer for tools/analysis/compare_backbones.py: the UperNet demo
# (upernet_soft-tiny_demo.py) with mmseg's ResNet-18 (ResNetV1c, the stem of
# mmseg's own UperNet configs, undilated: strides 4-32), trained from scratch
# like the demo's backbone (BatchNorm in training mode, no pretrained
# weights). Data, heads, schedule, optimiser and seed are the demo's.
_base_ = ['../demo/upernet_soft-tiny_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNetV1c',
        depth=18,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        dilations=(1, 1, 1, 1),
        strides=(1, 2, 2, 2),
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        contract_dilation=True,
        init_cfg=None),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
