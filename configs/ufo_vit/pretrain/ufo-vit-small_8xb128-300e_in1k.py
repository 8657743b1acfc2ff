"""UFO-ViT-S ImageNet-1k pre-training, DeiT recipe, with mmpretrain's tools
(the commands and the recipe: ``_base_/ufo-vit_8xb128-300e_in1k.py``)."""
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.1),
    head=dict(in_channels=304, num_heads=8))
