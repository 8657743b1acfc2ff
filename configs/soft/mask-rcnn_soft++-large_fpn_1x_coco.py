_base_ = './_base_/mask-rcnn_soft++_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='large',
        drop_path_rate=0.3,
        # The official SOFT++-large ImageNet-1k weights converted by
        # tools/model_converters/soft2mmsoft.py; configs/soft/README.md
        # ("Pretrained backbones") says how to get or make this file.
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft++_large_mmsoft.pth')))
