_base_ = './_base_/retinanet_soft++_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='medium',
        drop_path_rate=0.3,
        # The official SOFT++-medium ImageNet-1k checkpoint (SOFT_Medium_norm
        # of fudan-zvg/SOFT), converted while loading; configs/soft/README.md
        # ("Pretrained backbones") says where to get it.
        convert_weights=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft_medium_norm.pth')),
    neck=dict(in_channels=[64, 128, 288, 512]))
