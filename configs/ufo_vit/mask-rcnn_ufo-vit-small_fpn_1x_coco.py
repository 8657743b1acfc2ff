_base_ = './_base_/mask-rcnn_ufo-vit_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.1,
        # UFO-ViT-small ImageNet-1k weights. None are public: make them
        # with configs/ufo_vit/pretrain/ and
        # tools/model_converters/ufo_vit_cls2backbone.py (README,
        # "Pretrained backbones"), or train from scratch with
        # --cfg-options model.backbone.init_cfg=None.
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrained/ufo-vit-small_in1k.pth')),
    neck=dict(in_channels=[304] * 4))
