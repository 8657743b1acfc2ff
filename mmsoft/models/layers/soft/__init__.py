"""SOFT's layers: Gaussian kernel, its low-rank inverse, attention and block."""
from ...ops.gaussian_kernel import gaussian_kernel
from ...ops.kernel_inverse import VARIANTS, check_kernel_inverse_options, kernel_inverse
from .bottleneck_pool import cap_bottleneck_grid, capped_grid_size
from .soft_attention import SoftAttention, low_rank_kernel_attention
from .soft_block import SoftBlock

__all__ = [
    'cap_bottleneck_grid', 'capped_grid_size', 'gaussian_kernel', 'VARIANTS',
    'check_kernel_inverse_options', 'kernel_inverse', 'SoftAttention',
    'low_rank_kernel_attention', 'SoftBlock'
]
