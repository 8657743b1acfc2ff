"""Registered classification heads (ImageNet pre-training of the backbones)."""
from .class_attention_head import (ClassAttention, ClassAttentionBlock,
                                   ClassAttentionHead, soft_cross_entropy,
                                   topk_accuracy)

__all__ = [
    'ClassAttention', 'ClassAttentionBlock', 'ClassAttentionHead',
    'soft_cross_entropy', 'topk_accuracy'
]
