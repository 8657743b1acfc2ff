# A peer for tools/analysis/compare_backbones.py: the PVTv2-b0 demo peer
# (mask-rcnn_pvtv2-b0_fpn_demo.py) with mmdet's PVTv2-b1, whose widths
# (64/128/320/512) are SOFT-tiny's.
_base_ = ['./mask-rcnn_pvtv2-b0_fpn_demo.py']

model = dict(
    backbone=dict(embed_dims=64),
    neck=dict(in_channels=[64, 128, 320, 512]))
