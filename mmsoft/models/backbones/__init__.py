"""Registered backbones."""
from .soft import SOFT
from .soft_convert import load_soft_checkpoint, soft_official_to_mmsoft
from .ufo_vit import UFOViT
from .ufo_vit_convert import ufo_vit_cls_to_backbone

__all__ = ['SOFT', 'load_soft_checkpoint', 'soft_official_to_mmsoft', 'UFOViT',
           'ufo_vit_cls_to_backbone']
