_base_ = './_base_/mask-rcnn_soft++_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(
        arch='tiny',
        drop_path_rate=0.1,
        # The official SOFT++-tiny ImageNet-1k checkpoint (SOFT_Tiny_norm
        # of fudan-zvg/SOFT), converted while loading; configs/soft/README.md
        # ("Pretrained backbones") says where to get it.
        convert_weights=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft_tiny_norm.pth')))
