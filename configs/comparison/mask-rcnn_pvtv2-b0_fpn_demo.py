# A peer for tools/analysis/compare_backbones.py: the SOFT demo
# (mask-rcnn_soft-tiny_fpn_demo.py) with mmdet's PVTv2-b0, whose widths
# (32/64/160/256) are the demo backbone's. From scratch: no pretrained
# weights, no stochastic depth, like the demo's backbone. Data, neck,
# heads, schedule, optimiser and seed are the demo's.
_base_ = ['../demo/mask-rcnn_soft-tiny_fpn_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidVisionTransformerV2',
        embed_dims=32,
        num_layers=[2, 2, 2, 2],
        drop_path_rate=0.0,
        init_cfg=None),
    neck=dict(in_channels=[32, 64, 160, 256]))
