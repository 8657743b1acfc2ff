_base_ = './_base_/upernet_soft++_8xb2-160k_ade20k-512x512.py'

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
    decode_head=dict(in_channels=[64, 128, 288, 512]),
    auxiliary_head=dict(in_channels=288))
