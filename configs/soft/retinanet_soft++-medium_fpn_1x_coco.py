_base_ = './_base_/retinanet_soft++_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='medium',
        drop_path_rate=0.3,
        # The official SOFT++-medium ImageNet-1k weights converted by
        # tools/model_converters/soft2mmsoft.py; configs/soft/README.md
        # ("Pretrained backbones") says how to get or make this file.
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft++_medium_mmsoft.pth')),
    neck=dict(in_channels=[64, 128, 288, 512]))
