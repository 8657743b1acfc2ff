"""Building blocks of the backbones, by model.

* :mod:`.shared`: what both backbones use (patch embedding, MLP, head
  splitting, softmax attention, position-embedding resizing, weight init).
* :mod:`.soft`: SOFT's Gaussian-kernel attention and its pieces.
* :mod:`.ufo_vit`: UFO-ViT's XNorm attention and its pieces.
"""
from .shared import (MLP, ConvPatchEmbed, FeaturePyramidAdapter,
                     GlobalSoftmaxAttention, SoftmaxBlock, TanhGELU,
                     init_transformer_weights, resize_pos_embed)
from .soft import (SoftAttention, SoftBlock, cap_bottleneck_grid, capped_grid_size,
                   gaussian_kernel, kernel_inverse, low_rank_kernel_attention)
from .ufo_vit import (FourierPositionEncoding, LocalPatchInteraction,
                      UFOAttention, UFOBlock, ufo_attention, xnorm)

__all__ = [
    'cap_bottleneck_grid', 'capped_grid_size', 'ConvPatchEmbed', 'gaussian_kernel',
    'kernel_inverse', 'MLP', 'TanhGELU',
    'FourierPositionEncoding', 'resize_pos_embed', 'SoftAttention',
    'low_rank_kernel_attention', 'SoftBlock', 'GlobalSoftmaxAttention',
    'SoftmaxBlock', 'FeaturePyramidAdapter', 'LocalPatchInteraction',
    'UFOAttention', 'ufo_attention', 'xnorm', 'UFOBlock', 'init_transformer_weights'
]
