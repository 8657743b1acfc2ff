_base_ = './_base_/mask-rcnn_soft++_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='large',
        drop_path_rate=0.3,
        # The official SOFT++-large ImageNet-1k checkpoint (SOFT_Large_norm
        # of fudan-zvg/SOFT), converted while loading; configs/soft/README.md
        # ("Pretrained backbones") says where to get it.
        convert_weights=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft_large_norm.pth')))
