"""UFO-ViT-B ImageNet-1k pre-training, DeiT recipe, with mmpretrain's tools
(the commands and the recipe: ``_base_/ufo-vit_8xb128-300e_in1k.py``)."""
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.2),
    head=dict(in_channels=512, num_heads=8))
