"""SOFT attention: softmax-free Gaussian-kernel attention of linear cost."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch.utils.checkpoint import checkpoint

from .bottleneck_pool import cap_bottleneck_grid
from .chunked_kernel_product import chunked_kernel_product
from .gaussian_kernel import gaussian_kernel
from .kernel_inverse import check_kernel_inverse_options, kernel_inverse
from ..shared.attention_heads import merge_heads, split_heads
from ..shared.autograd_state import records_gradient
from ..shared.precision import (apply_without_autocast, backward_without_autocast,
                                full_precision)
from ..shared.valid_region import (ValidShapes, mask_map, region_tokens_to_grid,
                                   tokens_of_region)


def low_rank_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                              values: torch.Tensor, variant: str, solver: str,
                              newton_iters: int,
                              chunk_tokens: Optional[int] = None,
                              query_scale: float = 1.) -> torch.Tensor:
    """``K1 . M . (K1^T V)``: the low-rank part of SOFT attention.

    ``K1 = k(Q, L)``, ``A = k(L, L)`` with the Gaussian kernel ``k``;
    ``M = (A + 0.01 I)^-1`` for ``'soft'`` and ``D^-1/2 pinv(A) D^-1/2`` with
    ``D = diag(A 1)`` for ``'soft++'``. The product is evaluated right to left,
    so it costs O(N m d) and never forms an (N, N) matrix. With more than
    ``chunk_tokens`` queries, ``K1`` is not materialised either but computed
    chunk by chunk (see :mod:`.chunked_kernel_product`). When gradients are
    recorded, the same autograd function runs at every token count (in one
    chunk when they fit), so backward recomputes ``K1`` instead of keeping
    it; without gradients, and while exporting to ONNX, ``K1`` is formed
    whole below ``chunk_tokens``.

    Args:
        queries (Tensor): Queries Q0 before their scale, shape (B, h, N, d):
            the queries (= keys) are ``Q = query_scale * Q0``.
        bottleneck (Tensor): Bottleneck tokens L, shape (B, h, m, d).
        values (Tensor): Values V, shape (B, h, N, d).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``
            (see :mod:`.kernel_inverse`).
        newton_iters (int): Newton iterations.
        chunk_tokens (int, optional): Chunk size above which ``K1`` is
            recomputed per chunk instead of stored. Default: None (never).
        query_scale (float): Scale of the queries. In training the
            unscaled queries are kept for backward, and scaled chunk by
            chunk. Default: 1.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    training = records_gradient(queries, bottleneck, values)
    if training:  # backward recomputes A from L instead of keeping it
        bottleneck_kernel = checkpoint(gaussian_kernel, bottleneck, bottleneck,
                                       use_reentrant=False)  # (B, h, m, m)
    else:
        bottleneck_kernel = gaussian_kernel(bottleneck, bottleneck)  # (B, h, m, m)
    middle = kernel_inverse(bottleneck_kernel, variant, solver, newton_iters)
    if variant == 'soft++':
        inv_sqrt_degree = bottleneck_kernel.sum(-1).rsqrt()  # (B, h, m)
        middle = symmetric_scale(middle, inv_sqrt_degree)
    tokens = queries.shape[-2]
    if training:
        # Training: the kernel is recomputed in backward, never stored.
        chunk = tokens if chunk_tokens is None else min(chunk_tokens, tokens)
        return chunked_kernel_product(queries, bottleneck, middle, values, chunk,
                                      query_scale)
    queries = queries * query_scale
    if chunk_tokens is not None and tokens > chunk_tokens:
        return chunked_kernel_product(queries, bottleneck, middle, values,
                                      chunk_tokens)
    query_kernel = gaussian_kernel(queries, bottleneck)  # (B, h, N, m)
    summary = query_kernel.transpose(-1, -2) @ values  # (B, h, m, d)
    return query_kernel @ (middle @ summary)  # (B, h, N, d)


def _scaled_both_sides(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(d) P diag(d)``: (..., m, m), (..., m) -> (..., m, m)."""
    return scale.unsqueeze(-1) * mat * scale.unsqueeze(-2)


class SymmetricScale(torch.autograd.Function):
    """Autograd function of :func:`symmetric_scale`: keeps P and d only.

    With ``G = dL/dout``: ``dP = G o (d d^T)``;
    ``dd = (G o P) d + (G o P)^T d``.
    """

    @staticmethod
    def forward(ctx, mat, scale):
        ctx.save_for_backward(mat, scale)
        return _scaled_both_sides(mat, scale)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        mat, scale = ctx.saved_tensors
        weighted = grad_out * mat  # (..., m, m)
        column = scale.unsqueeze(-1)  # (..., m, 1)
        grad_mat = _scaled_both_sides(grad_out, scale)
        grad_scale = weighted @ column + weighted.transpose(-1, -2) @ column
        return grad_mat, grad_scale.squeeze(-1)


def symmetric_scale(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(d) P diag(d)`` without keeping an intermediate m x m product.

    Args:
        mat (Tensor): P, shape (..., m, m).
        scale (Tensor): d, shape (..., m).

    Returns:
        Tensor: Shape (..., m, m).
    """
    if not records_gradient(mat, scale):
        return _scaled_both_sides(mat, scale)
    return apply_without_autocast(SymmetricScale, mat, scale)


class SoftAttention(BaseModule):
    """Softmax-free self-attention with a shared query/key projection.

    ``out = ff(K1 . M . (K1^T V) + DWConv(V))`` where the queries double as
    keys, the bottleneck tokens L come from a stride-``sr_ratio`` convolution
    of the query grid (shared across heads) followed by LayerNorm and GELU,
    and ``M`` is the (regularised or symmetric-normalised pseudo-) inverse of
    the bottleneck kernel matrix (see :func:`low_rank_kernel_attention`).

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads; ``embed_dims`` must be a multiple.
        sr_ratio (int): Stride of the bottleneck convolution.
        local_kernel_size (int): Kernel of the depth-wise convolution on V,
            one kernel per head shared over its channels.
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft'``.
        solver (str): ``'newton'`` (the reference iteration),
            ``'newton_closed_form'`` (the same function from one
            eigendecomposition) or ``'exact'`` (its limit; see
            :mod:`.kernel_inverse`). Default: ``'newton'``.
        newton_iters (int): Newton iterations. Default: 20.
        max_bottleneck_tokens (int, optional): Cap on the bottleneck token
            count m; a larger bottleneck grid is average-pooled down to it.
            None keeps every token. Default: None.
        kernel_chunk_tokens (int, optional): Above this many tokens the
            query-bottleneck kernel is recomputed chunk by chunk rather than
            held whole (forward and backward), bounding memory. None always
            holds it. Default: None.
        init_cfg (dict, optional): Initialization config. Default: None.
    """

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
        self.kernel_chunk_tokens = kernel_chunk_tokens

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.bottleneck_conv = nn.Conv2d(
            self.head_dims, self.head_dims, sr_ratio, stride=sr_ratio, bias=False)
        self.bottleneck_norm = nn.LayerNorm(self.head_dims)
        self.local_conv = nn.Conv2d(
            num_heads, num_heads, local_kernel_size,
            padding=local_kernel_size // 2, groups=num_heads, bias=False)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    def bottleneck_tokens(self, query_map: torch.Tensor) -> torch.Tensor:
        """Bottleneck tokens L from the (unscaled) query map.

        The per-head convolution (one ``d -> d`` kernel shared by all heads)
        runs as a grouped convolution over all ``h * d`` channels.

        Args:
            query_map (Tensor): Queries as a map, shape (B, h * d, H, W).

        Returns:
            Tensor: Shape (B, h, m, d), before the query scaling.
        """
        batch = query_map.shape[0]
        weight = self.bottleneck_conv.weight.repeat(self.num_heads, 1, 1, 1)
        grid = F.conv2d(query_map, weight, stride=self.bottleneck_conv.stride,
                        groups=self.num_heads)  # (B, h*d, H/r, W/r)
        grid = cap_bottleneck_grid(grid, self.max_bottleneck_tokens)
        tokens = grid.reshape(batch, self.num_heads, self.head_dims, -1)
        return tokens.transpose(-1, -2)  # (B, h, m, d)

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

    def global_term(self, query_map: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``K1 . M . (K1^T V)`` of one grid of tokens.

        Args:
            query_map (Tensor): Unscaled queries as a map, shape
                (B, h * d, H, W).
            values (Tensor): Values V, shape (B, h, H * W, d).

        Returns:
            Tensor: Shape (B, h, H * W, d), float32 or float64.
        """
        scale = self.head_dims**-0.25
        # The bottleneck convolution is linear: scaling its input or output
        # is the same.
        landmarks = self.bottleneck_tokens(query_map) * scale  # (B, h, m, d)
        bottleneck = F.gelu(self.bottleneck_norm(landmarks))
        query_tokens = query_map.flatten(2).transpose(1, 2)  # (B, N, C)
        queries = split_heads(query_tokens, self.num_heads)  # (B, h, N, d)
        with torch.autocast(device_type=query_map.device.type, enabled=False):
            return low_rank_kernel_attention(
                full_precision(queries), full_precision(bottleneck),
                full_precision(values), self.variant, self.solver,
                self.newton_iters, self.kernel_chunk_tokens, query_scale=scale)

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
        query_tokens = self.q_proj(x)  # (B, N, C)
        value_tokens = self.v_proj(x)  # (B, N, C)
        # Token-major (B, N, C) is the channels-last layout of a (B, C, H, W)
        # map: the convolutions read it without a copy.
        query_map = query_tokens.transpose(1, 2).view(batch, channels, *hw_shape)
        value_map = value_tokens.transpose(1, 2).view(batch, channels, *hw_shape)
        values = split_heads(value_tokens, self.num_heads)  # (B, h, N, d)
        if valid_shapes is None:
            out = self.global_term(query_map, values)
        else:
            out = self.global_term_per_image(query_map, values, valid_shapes)
        local = self.local_term(mask_map(value_map, valid_shapes))
        local = local.flatten(2).transpose(1, 2)  # (B, N, C)
        out = local + merge_heads(out.to(local.dtype))
        return self.out_proj(out)
