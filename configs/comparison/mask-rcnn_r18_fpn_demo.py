# A peer for tools/analysis/compare_backbones.py: the SOFT demo
# (mask-rcnn_soft-tiny_fpn_demo.py) with mmdet's ResNet-18 as the backbone,
# trained from scratch like the demo's (no frozen stage, BatchNorm in
# training mode, no pretrained weights). Data, neck, heads, schedule,
# optimiser and seed are the demo's.
_base_ = ['../demo/mask-rcnn_soft-tiny_fpn_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=18,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
