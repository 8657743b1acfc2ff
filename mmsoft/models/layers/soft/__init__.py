"""SOFT's layers: Gaussian kernel, its low-rank inverse, attention and block."""
from .bottleneck_pool import cap_bottleneck_grid, capped_grid_size
from .chunked_kernel_product import chunked_kernel_product
from .gaussian_kernel import gaussian_kernel
from .kernel_inverse import kernel_inverse, solve_kernel_inverse
from .soft_attention import SoftAttention, low_rank_kernel_attention
from .soft_block import SoftBlock

__all__ = [
    'cap_bottleneck_grid', 'capped_grid_size', 'chunked_kernel_product',
    'gaussian_kernel', 'kernel_inverse', 'solve_kernel_inverse', 'SoftAttention',
    'low_rank_kernel_attention', 'SoftBlock'
]
