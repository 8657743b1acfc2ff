_base_ = './_base_/mask-rcnn_soft++_fpn_ms-3x_coco.py'

# SOFT++-small with the reference code's depths (1, 3, 20, 4), so that the
# official checkpoint loads; its README's 24M describes a smaller model.
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.2,
        # The official SOFT++-small ImageNet-1k checkpoint (SOFT_Small_norm
        # of fudan-zvg/SOFT), converted while loading; configs/soft/README.md
        # ("Pretrained backbones") says where to get it.
        convert_weights=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft_small_norm.pth')))
