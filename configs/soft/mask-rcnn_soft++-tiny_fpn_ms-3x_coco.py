_base_ = './_base_/mask-rcnn_soft++_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(
        arch='tiny',
        drop_path_rate=0.1,
        # The official SOFT++-tiny ImageNet-1k weights converted by
        # tools/model_converters/soft2mmsoft.py; configs/soft/README.md
        # ("Pretrained backbones") says how to get or make this file.
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/soft++_tiny_mmsoft.pth')))
