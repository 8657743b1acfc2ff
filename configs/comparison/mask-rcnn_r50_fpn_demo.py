# A peer for tools/analysis/compare_backbones.py: the ResNet-18 demo peer
# (mask-rcnn_r18_fpn_demo.py) with mmdet's ResNet-50.
_base_ = ['./mask-rcnn_r18_fpn_demo.py']

model = dict(
    backbone=dict(depth=50),
    neck=dict(in_channels=[256, 512, 1024, 2048]))
