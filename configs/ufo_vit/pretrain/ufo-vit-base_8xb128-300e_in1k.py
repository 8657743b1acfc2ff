# UFO-ViT-base on ImageNet-1k, DeiT recipe (see _base_/ufo-vit_8xb128-300e_in1k.py).
# Then: python tools/model_converters/ufo_vit_cls2backbone.py \
#     work_dirs/ufo-vit-base_8xb128-300e_in1k/best_accuracy_top1_epoch_N.pth \
#     pretrained/ufo-vit-base_in1k.pth
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.2),
    head=dict(in_channels=512, num_heads=8))
