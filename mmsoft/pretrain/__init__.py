"""What UFO-ViT's ImageNet pre-training (mmpretrain configs and tools) adds
to mmpretrain's ``MODELS``: the class-attention head and UFO-ViT at stride 16."""
from .head import UFOViTClassAttentionHead
from .ufo_vit_stride16 import UFOViTStride16

__all__ = ['UFOViTClassAttentionHead', 'UFOViTStride16']
