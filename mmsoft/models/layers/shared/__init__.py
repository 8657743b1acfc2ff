"""Layers both backbones (and the pre-training head) use."""
from .attention_heads import merge_heads, split_heads
from .conv_stem import ConvPatchEmbed
from .feature_pyramid import FeaturePyramidAdapter
from .mlp import MLP, TanhGELU
from .position import resize_pos_embed
from ...ops.precision import full_precision
from .softmax_block import GlobalSoftmaxAttention, SoftmaxBlock
from .weight_init import init_transformer_weights

__all__ = [
    'merge_heads', 'split_heads', 'ConvPatchEmbed', 'FeaturePyramidAdapter',
    'MLP', 'TanhGELU', 'resize_pos_embed',
    'full_precision',
    'GlobalSoftmaxAttention', 'SoftmaxBlock', 'init_transformer_weights'
]
