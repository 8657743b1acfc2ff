"""Registered backbones."""
from .soft import SOFT
from .ufo_vit import UFOViT

__all__ = ['SOFT', 'UFOViT']
