"""SOFT attention: softmax-free Gaussian-kernel attention of linear cost.

For tokens x (B, N, C) on an (H, W) grid, h heads of d = C / h channels,
:class:`SoftAttention` computes

1. queries ``Q0 = x W_q`` (they double as keys) and values ``V = x W_v``;
2. m bottleneck tokens ``L``: a stride-r convolution of each head's query
   map (one kernel shared by the heads), average-pooled down to at most
   ``max_bottleneck_tokens``, scaled by ``d^-1/4`` as the queries are
   (``Q = d^-1/4 Q0``), then LayerNorm and GELU;
3. :func:`low_rank_kernel_attention`: ``K1 . (middle . (K1^T V))`` with the
   Gaussian kernels ``A = k(L, L)`` and ``K1 = k(Q, L)``,
   ``k(x, y) = exp(-|x - y|^2 / 2)``, and ``middle`` the inverse of A;
4. plus a depth-wise convolution of V (one kernel per head), then the output
   projection.
"""
from functools import partial
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ...memory_efficient import kernel_attention as memory_efficient
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from ...ops.contiguous_gradient import contiguous_gradient
from ...ops.gaussian_kernel import bottleneck_kernel, gaussian_kernel
from ...ops.kernel_inverse import (EXPORT_SOLVERS, check_kernel_inverse_options,
                                   kernel_inverse, scaled_both_sides)
from ...ops.precision import full_precision
from ...ops.valid_region import (ValidShapes, mask_map, region_tokens_to_grid,
                                 tokens_of_region)
from ...tracing import Exportable
from ..shared.attention_heads import merge_heads, split_heads
from ..shared.gelu import gelu
from .bottleneck_pool import cap_bottleneck_grid
from .traced_bottleneck_pool import traceable_cap_bottleneck_grid


def low_rank_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                              values: torch.Tensor, variant: str, solver: str,
                              newton_iters: int,
                              query_scale: float = 1.) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``: the low-rank part of SOFT attention.

    ``K1 = k(Q, L)``, ``A = k(L, L)`` with the Gaussian kernel ``k``;
    ``middle = (A + 0.01 I)^-1`` for ``'soft'`` and
    ``D^-1/2 pinv(A) D^-1/2`` with ``D = diag(A 1)`` for ``'soft++'``.
    :func:`mmsoft.models.memory_efficient.kernel_attention.low_rank_kernel_attention`
    computes the same, keeping less for backward.

    Args:
        queries (Tensor): Queries Q0 before their scale, shape (B, h, N, d):
            the queries (= keys) are ``Q = query_scale * Q0``.
        bottleneck (Tensor): Bottleneck tokens L, shape (B, h, m, d).
        values (Tensor): Values V, shape (B, h, N, d).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``,
            as :func:`~mmsoft.models.ops.kernel_inverse.check_kernel_inverse_options`
            returns it.
        newton_iters (int): Newton iterations.
        query_scale (float): Scale of the queries. Default: 1.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    kernel_a = bottleneck_kernel(bottleneck)  # A = k(L, L): (B, h, m, m)
    middle = kernel_inverse(kernel_a, variant, solver, newton_iters)  # (B, h, m, m)
    if variant == 'soft++':
        # D^-1/2 . middle . D^-1/2, D = diag(A 1)
        middle = scaled_both_sides(middle, kernel_a.sum(-1).rsqrt())  # (B,h,m,m)
    query_kernel = gaussian_kernel(queries * query_scale, bottleneck)  # K1: (B,h,N,m)
    summary = query_kernel.transpose(-1, -2) @ values  # K1^T V: (B, h, m, d)
    return query_kernel @ (middle @ summary)  # (B, h, N, d)


class SoftAttention(BaseModule, MemoryEfficient, Exportable):
    """Softmax-free self-attention with a shared query/key projection.

    ``out = ff(K1 . (middle . (K1^T V)) + DWConv(V))`` where the queries
    double as keys, the bottleneck tokens L come from a stride-``sr_ratio``
    convolution of the query grid (shared across heads) followed by LayerNorm
    and GELU, and ``middle`` is the (regularised, or symmetric-normalised
    pseudo-) inverse of the bottleneck kernel matrix (see the module
    docstring and :func:`low_rank_kernel_attention`).

    With its switch on (:class:`~mmsoft.models.memory_efficient.MemoryEfficient`),
    the layer runs
    :func:`mmsoft.models.memory_efficient.kernel_attention.low_rank_kernel_attention`
    instead of :func:`low_rank_kernel_attention`; its export formulation
    (:class:`~mmsoft.models.tracing.Exportable`) runs the Newton iteration for
    ``'newton_closed_form'`` and caps the bottleneck on traced sizes.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads; ``embed_dims`` must be a multiple.
        sr_ratio (int): Stride of the bottleneck convolution.
        local_kernel_size (int): Kernel of the depth-wise convolution on V,
            one kernel per head shared over its channels.
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``
            (see :mod:`~mmsoft.models.ops.kernel_inverse`). Default:
            ``'newton'``.
        newton_iters (int): Newton iterations. Default: 20.
        max_bottleneck_tokens (int, optional): Cap on the bottleneck token
            count m; a larger bottleneck grid is average-pooled down to it.
            None keeps every token. Default: None.
        kernel_chunk_tokens (int, optional): Most rows of the
            query-bottleneck kernel the memory-efficient implementation holds
            at a time. None: all. Default: None.
        init_cfg (dict, optional): Initialization config. Default: None.

    Raises:
        ValueError: ``embed_dims`` not a multiple of ``num_heads``, or an
            unknown ``variant`` or ``solver``.
    """

    saves_memory_in_inference = True

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sr_ratio: int,
                 local_kernel_size: int,
                 variant: str = 'soft',
                 solver: str = 'newton',
                 newton_iters: int = 20,
                 max_bottleneck_tokens: Optional[int] = None,
                 kernel_chunk_tokens: Optional[int] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by '
                             f'num_heads={num_heads}.')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.variant = variant
        self.solver = check_kernel_inverse_options(variant, solver)
        self.newton_iters = newton_iters
        self.max_bottleneck_tokens = max_bottleneck_tokens
        #: :func:`low_rank_kernel_attention`'s memory-efficient implementation.
        self.memory_efficient_attention = partial(
            memory_efficient.low_rank_kernel_attention,
            chunk_tokens=kernel_chunk_tokens)

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.bottleneck_conv = nn.Conv2d(
            self.head_dims, self.head_dims, sr_ratio, stride=sr_ratio, bias=False)
        self.bottleneck_norm = nn.LayerNorm(self.head_dims)
        self.local_conv = nn.Conv2d(
            num_heads, num_heads, local_kernel_size,
            padding=local_kernel_size // 2, groups=num_heads, bias=False)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    def bottleneck_tokens(self, query_map: torch.Tensor,
                          scale: float) -> torch.Tensor:
        """Bottleneck tokens L from the (unscaled) query map.

        The per-head convolution (one ``d -> d`` kernel shared by all heads)
        runs as a grouped convolution over all ``h * d`` channels. It and
        the capping pool are linear: scaling their output by the query scale
        is scaling their input.

        Args:
            query_map (Tensor): Queries Q0 as a map, shape (B, h * d, H, W).
            scale (float): The query scale.

        Returns:
            Tensor: Shape (B, h, m, d).
        """
        batch = query_map.shape[0]
        weight = self.bottleneck_conv.weight.repeat(self.num_heads, 1, 1, 1)
        grid = F.conv2d(query_map, weight, stride=self.bottleneck_conv.stride,
                        groups=self.num_heads)  # (B, h*d, H/r, W/r)
        cap = traceable_cap_bottleneck_grid if self.exportable else cap_bottleneck_grid
        grid = cap(grid, self.max_bottleneck_tokens)  # h'w' <= cap
        bottleneck = grid.reshape(batch, self.num_heads, self.head_dims, -1)
        # LayerNorm's input and gradient contiguous: the compiler's stride
        # model of its backward follows their layout, the CPU kernel's
        # output is contiguous.
        bottleneck = (bottleneck.transpose(-1, -2) * scale).contiguous()  # (B, h, m, d)
        return contiguous_gradient(gelu(self.bottleneck_norm(bottleneck)))  # L

    def global_term(self, query_map: torch.Tensor,
                    values: torch.Tensor) -> torch.Tensor:
        """``K1 . (middle . (K1^T V))`` of one grid of tokens, in float32
        (or float64) under autocast too.

        Args:
            query_map (Tensor): Unscaled queries Q0 as a map, shape
                (B, h * d, H, W).
            values (Tensor): Values V, shape (B, h, H * W, d).

        Returns:
            Tensor: Shape (B, h, H * W, d), float32 or float64.
        """
        scale = self.head_dims**-0.25  # Q = scale * Q0
        bottleneck = self.bottleneck_tokens(query_map, scale)  # L: (B, h, m, d)
        query_tokens = query_map.flatten(2).transpose(1, 2)  # (B, N, C)
        queries = split_heads(query_tokens, self.num_heads)  # Q0: (B, h, N, d)
        kernel_attention = (self.memory_efficient_attention
                            if takes_memory_efficient_path(self)
                            else low_rank_kernel_attention)
        solver = EXPORT_SOLVERS[self.solver] if self.exportable else self.solver
        with torch.autocast(device_type=query_map.device.type, enabled=False):
            return kernel_attention(full_precision(queries), full_precision(bottleneck),
                                    full_precision(values), self.variant, solver,
                                    self.newton_iters, query_scale=scale)

    def global_term_per_image(self, query_map: torch.Tensor, values: torch.Tensor,
                              valid_shapes: ValidShapes) -> torch.Tensor:
        """:meth:`global_term` of each image's valid grid alone, zero outside.

        Padded tokens then take no part in the bottleneck tokens, in
        ``K1^T V``, in the kernel matrix A or in the capping pool; images
        may have different bottleneck counts, hence one call per image.

        Args:
            query_map (Tensor): Unscaled queries, shape (B, h * d, H, W).
            values (Tensor): Values V, shape (B, h, H * W, d).
            valid_shapes (list[tuple[int, int]]): Valid (h, w) per image.

        Returns:
            Tensor: Shape (B, h, H * W, d).
        """
        hw_shape = query_map.shape[-2:]
        outs = []
        for index, (height, width) in enumerate(valid_shapes):
            region_map = query_map[index:index + 1, :, :height, :width]
            region_values = tokens_of_region(values[index:index + 1], hw_shape,
                                             (height, width))  # (1, h, n, d)
            out = self.global_term(region_map, region_values)  # (1, h, n, d)
            outs.append(region_tokens_to_grid(out, (height, width), hw_shape))
        return torch.cat(outs)

    def local_term(self, value_map: torch.Tensor) -> torch.Tensor:
        """Depth-wise convolution of V, one kernel per head.

        Args:
            value_map (Tensor): Values as a map, shape (B, h * d, H, W).

        Returns:
            Tensor: Shape (B, h * d, H, W).
        """
        weight = self.local_conv.weight.repeat_interleave(self.head_dims, dim=0)
        return F.conv2d(value_map, weight, padding=self.local_conv.padding,
                        groups=weight.shape[0])

    def forward(self, x: torch.Tensor, hw_shape,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Forward.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid. Given, each image attends only
                within it, as it would alone: the global term runs per image
                on its region and the local convolution sees zeros outside.
                The output outside the regions is meaningless. Default: None
                (every token is valid).

        Returns:
            Tensor: Shape (B, N, C).
        """
        batch, tokens, channels = x.shape
        query_tokens = self.q_proj(x)  # Q0: (B, N, C)
        value_tokens = self.v_proj(x)  # V: (B, N, C)
        # Token-major (B, N, C) is the channels-last layout of a (B, C, H, W)
        # map: the convolutions read it without a copy.
        query_map = query_tokens.transpose(1, 2).view(batch, channels, *hw_shape)
        value_map = value_tokens.transpose(1, 2).view(batch, channels, *hw_shape)
        values = split_heads(value_tokens, self.num_heads)  # (B, h, N, d)
        if valid_shapes is None:
            out = self.global_term(query_map, values)  # (B, h, N, d)
        else:
            out = self.global_term_per_image(query_map, values, valid_shapes)
        local = self.local_term(mask_map(value_map, valid_shapes))  # (B, C, H, W)
        local = local.flatten(2).transpose(1, 2)  # (B, N, C)
        out = local + merge_heads(out.to(local.dtype))  # (B, N, C)
        return self.out_proj(out)
