"""Registered backbones."""
from .soft import SOFT
from .soft_convert import load_soft_checkpoint, soft_official_to_mmsoft
from .ufo_vit import UFOViT

__all__ = ['SOFT', 'load_soft_checkpoint', 'soft_official_to_mmsoft', 'UFOViT']
