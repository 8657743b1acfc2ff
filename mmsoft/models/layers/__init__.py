"""Building blocks of the backbones."""
from .bottleneck_pool import cap_bottleneck_grid, capped_grid_size
from .conv_stem import ConvPatchEmbed
from .gaussian_kernel import gaussian_kernel
from .kernel_inverse import kernel_inverse, solve_kernel_inverse
from .mlp import MLP, TanhGELU
from .position import FourierPositionEncoding, resize_pos_embed
from .soft_attention import SoftAttention, low_rank_kernel_attention
from .soft_block import SoftBlock
from .softmax_block import GlobalSoftmaxAttention, SoftmaxBlock
from .feature_pyramid import FeaturePyramidAdapter
from .local_patch_interaction import LocalPatchInteraction
from .ufo_attention import UFOAttention, ufo_attention, xnorm
from .ufo_block import UFOBlock

__all__ = [
    'cap_bottleneck_grid', 'capped_grid_size', 'ConvPatchEmbed', 'gaussian_kernel',
    'kernel_inverse', 'solve_kernel_inverse', 'MLP', 'TanhGELU',
    'FourierPositionEncoding', 'resize_pos_embed', 'SoftAttention',
    'low_rank_kernel_attention', 'SoftBlock', 'GlobalSoftmaxAttention',
    'SoftmaxBlock', 'FeaturePyramidAdapter', 'LocalPatchInteraction',
    'UFOAttention', 'ufo_attention', 'xnorm', 'UFOBlock'
]
