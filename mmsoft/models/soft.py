"""SOFT / SOFT++: softmax-free transformers with linear complexity.

Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity* (NeurIPS 2021) and
*Softmax-free Linear Transformers* (IJCV 2024). Attention is a Gaussian kernel with
shared queries and keys, made linear in the token count by a low-rank approximation
through bottleneck tokens and the (pseudo-)inverse of their kernel matrix; SOFT++
normalises it symmetrically.
"""
import math
from functools import partial
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..utils.torch_compat import autocast_off
from ..utils.validation import (check_choice, check_divisible, check_lengths,
                                check_positive_int, resolve_arch)
from .layers import (MLP, ConvPatchEmbed, DenseBackbone, Exportable, MemoryEfficient,
                     TanhGELU, ValidShapes, accept_renamed, contiguous_gradient,
                     drop_path_or_identity, full_precision, gelu,
                     init_transformer_weights, interpolate_pos_embed, mask_map,
                     merge_heads, region_tokens_to_grid, resize_pos_embed,
                     resize_pos_embed_to_regions, split_heads, take_indices,
                     takes_memory_efficient_path, tokens_of_region, tokens_to_map,
                     valid_mask)
from .soft_kernels import (EXPORT_SOLVERS, bottleneck_kernel,
                           check_kernel_inverse_options, gaussian_kernel,
                           kernel_inverse, memory_efficient_kernel_attention,
                           scaled_both_sides, solver_that_runs)


# --- Bottleneck cap
def capped_grid_size(height: int, width: int,
                     max_tokens: Optional[int]) -> Tuple[int, int]:
    """Largest grid with the aspect of ``height x width``, <= ``max_tokens`` cells."""
    if max_tokens is None or height * width <= max_tokens:
        return height, width
    scale = math.sqrt(max_tokens / (height * width))
    rows = min(height, max(1, math.floor(height * scale)))
    cols = min(width, max(1, math.floor(width * scale)))
    # Only a side clamped up to 1 can push the product over the cap.
    if rows == 1:
        cols = min(cols, max_tokens)
    if cols == 1:
        rows = min(rows, max_tokens)
    return rows, cols


def cap_bottleneck_grid(grid: torch.Tensor, max_tokens: Optional[int]) -> torch.Tensor:
    """Average-pools a grid (B, d, h, w) to (B, d, h', w'), h' w' <= ``max_tokens``."""
    size = capped_grid_size(grid.shape[-2], grid.shape[-1], max_tokens)
    if size == tuple(grid.shape[-2:]):
        return grid
    return F.adaptive_avg_pool2d(grid, size)


def traceable_capped_grid_size(height: torch.Tensor, width: torch.Tensor,
                               max_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`capped_grid_size` on 0-dim int64 tensors, without branches."""
    cap = torch.tensor(max_tokens, dtype=torch.float64)
    scale = torch.sqrt(cap / (height.to(torch.float64) * width.to(torch.float64)))
    # Truncation is the floor here: both products are positive.
    rows = torch.minimum(height, (height * scale).to(torch.int64).clamp_min(1))
    cols = torch.minimum(width, (width * scale).to(torch.int64).clamp_min(1))
    cols = torch.where(rows == 1, cols.clamp_max(max_tokens), cols)
    rows = torch.where(cols == 1, rows.clamp_max(max_tokens), rows)
    return rows, cols


def averaging_matrix(size_in: torch.Tensor, size_out: torch.Tensor,
                     dtype: torch.dtype, device=None) -> torch.Tensor:
    """Adaptive average pooling of n cells to k along one axis, as a (k, n) matrix.

    Row i is ``1 / len(bin_i)`` on bin i ``= [floor(i n / k), ceil((i + 1) n / k))``.
    """
    index = torch.arange(size_out, device=device)  # (k, )
    start = torch.div(index * size_in, size_out, rounding_mode='floor')
    end = torch.div((index + 1) * size_in + size_out - 1, size_out,
                    rounding_mode='floor')
    cells = torch.arange(size_in, device=device)  # (n, )
    inside = (cells >= start[:, None]) & (cells < end[:, None])  # (k, n)
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def traceable_cap_bottleneck_grid(grid: torch.Tensor,
                                  max_tokens: Optional[int]) -> torch.Tensor:
    """:func:`cap_bottleneck_grid` as matrix products, traceable for any grid size."""
    if max_tokens is None:
        return grid
    shape = torch._shape_as_tensor(grid)  # (4, ) int64
    height, width = shape[-2], shape[-1]
    rows, cols = traceable_capped_grid_size(height, width, max_tokens)
    pool_rows = averaging_matrix(height, rows, grid.dtype, grid.device)  # (h', h)
    pool_cols = averaging_matrix(width, cols, grid.dtype, grid.device)  # (w', w)
    return pool_rows @ grid @ pool_cols.transpose(0, 1)  # (B, d, h', w')


# --- SOFT attention
def low_rank_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                              values: torch.Tensor, variant: str, solver: str,
                              newton_iters: int,
                              query_scale: float = 1.) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``: the low-rank part of SOFT attention.

    ``K1 = k(Q, L)``, ``A = k(L, L)``; ``middle = (A + 0.01 I)^-1`` (``'soft'``) or
    ``D^-1/2 pinv(A) D^-1/2`` with ``D = diag(A 1)`` (``'soft++'``).

    Args:
        queries (Tensor): Unscaled queries Q0 (= keys), shape (B, h, N, d).
        bottleneck (Tensor): Bottleneck tokens L, shape (B, h, m, d).
        values (Tensor): Values V, shape (B, h, N, d).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
        newton_iters (int): Newton iterations.
        query_scale (float): ``Q = query_scale * Q0``. Default: 1.

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


class SoftAttention(MemoryEfficient, Exportable, nn.Module):
    """Softmax-free attention: ``out = ff(K1 . middle . (K1^T V) + DWConv(V))``.

    Queries double as keys, ``Q = d^-1/4 Q0``. Bottleneck tokens L come from a
    stride-``sr_ratio`` conv shared by heads + LayerNorm + GELU, capped at
    ``max_bottleneck_tokens`` by average pooling.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads.
        sr_ratio (int): Stride of the bottleneck convolution.
        local_kernel_size (int): Kernel of the per-head depth-wise convolution on V.
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
            Default: ``'newton'``.
        newton_iters (int): Newton iterations. Default: 20.
        max_bottleneck_tokens (int, optional): Cap on m; None: no cap. Default: None.
        kernel_chunk_tokens (int, optional): Rows of ``K1`` the memory-efficient
            path holds at a time; None: all. Default: None.

    Raises:
        ValueError: ``embed_dims`` not a multiple of ``num_heads``, or an unknown
            ``variant`` or ``solver``.
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
                 kernel_chunk_tokens: Optional[int] = None):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by '
                             f'num_heads={num_heads}.')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.variant = variant
        self.solver = check_kernel_inverse_options(variant, solver)
        self.newton_iters = newton_iters
        self.max_bottleneck_tokens = max_bottleneck_tokens
        #: Memory-efficient :func:`low_rank_kernel_attention`.
        self.memory_efficient_attention = partial(
            memory_efficient_kernel_attention,
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
        """Bottleneck tokens L (B, h, m, d) of ``scale`` * Q0 map (B, h * d, H, W)."""
        batch = query_map.shape[0]
        weight = self.bottleneck_conv.weight.repeat(self.num_heads, 1, 1, 1)
        grid = F.conv2d(query_map, weight, stride=self.bottleneck_conv.stride,
                        groups=self.num_heads)  # (B, h*d, H/r, W/r)
        cap = traceable_cap_bottleneck_grid if self.exportable else cap_bottleneck_grid
        grid = cap(grid, self.max_bottleneck_tokens)  # h'w' <= cap
        bottleneck = grid.reshape(batch, self.num_heads, self.head_dims, -1)
        # LayerNorm's input and gradient contiguous, for the compiler's stride model.
        bottleneck = (bottleneck.transpose(-1, -2) * scale).contiguous()  # (B, h, m, d)
        return contiguous_gradient(gelu(self.bottleneck_norm(bottleneck)))  # L

    def global_term(self, query_map: torch.Tensor,
                    values: torch.Tensor) -> torch.Tensor:
        """``K1 . middle . (K1^T V)`` of one grid in full precision: Q0 map
        (B, h * d, H, W), V (B, h, H * W, d) -> (B, h, H * W, d)."""
        scale = self.head_dims**-0.25  # Q = scale * Q0
        bottleneck = self.bottleneck_tokens(query_map, scale)  # L: (B, h, m, d)
        query_tokens = query_map.flatten(2).transpose(1, 2)  # (B, N, C)
        queries = split_heads(query_tokens, self.num_heads)  # Q0: (B, h, N, d)
        kernel_attention = (self.memory_efficient_attention
                            if takes_memory_efficient_path(self)
                            else low_rank_kernel_attention)
        solver = (EXPORT_SOLVERS[self.solver] if self.exportable
                  else solver_that_runs(self.solver, query_map.device.type))
        with autocast_off(query_map.device.type):
            return kernel_attention(full_precision(queries), full_precision(bottleneck),
                                    full_precision(values), self.variant, solver,
                                    self.newton_iters, query_scale=scale)

    def global_term_per_image(self, query_map: torch.Tensor, values: torch.Tensor,
                              valid_shapes: ValidShapes) -> torch.Tensor:
        """:meth:`global_term` of each image's valid region alone; zero outside it."""
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
        """Per-head depth-wise convolution of V: (B, h * d, H, W) -> same shape."""
        weight = self.local_conv.weight.repeat_interleave(self.head_dims, dim=0)
        return F.conv2d(value_map, weight, padding=self.local_conv.padding,
                        groups=weight.shape[0])

    def forward(self, x: torch.Tensor, hw_shape,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Forward.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.
            valid_shapes (list[tuple[int, int]], optional): Each image's valid
                region; each image attends only within it. Default: None (all).

        Returns:
            Tensor: Shape (B, N, C); meaningless outside the valid regions.
        """
        batch, tokens, channels = x.shape
        query_tokens = self.q_proj(x)  # Q0: (B, N, C)
        value_tokens = self.v_proj(x)  # V: (B, N, C)
        # (B, N, C) is a channels-last (B, C, H, W) map: the convolutions need no copy.
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


# --- Blocks
class SoftBlock(nn.Module):
    """Post-norm ``x = LN(x + attn(x)); x = LN(x + MLP(x))`` with SOFT attention.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads.
        sr_ratio (int): Stride of the bottleneck convolution.
        local_kernel_size (int): Kernel of the depth-wise convolution on V.
        mlp_ratio (float): MLP (tanh GELU) hidden width / C. Default: 4.
        drop_path (float): Stochastic depth rate. Default: 0.
        **attn_kwargs: Further :class:`SoftAttention` arguments.
    """

    def __init__(self, embed_dims: int, num_heads: int, sr_ratio: int,
                 local_kernel_size: int, mlp_ratio: float = 4.,
                 drop_path: float = 0., **attn_kwargs):
        super().__init__()
        self.attn = SoftAttention(embed_dims, num_heads, sr_ratio,
                                  local_kernel_size, **attn_kwargs)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio), act_layer=TanhGELU)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor, hw_shape,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, N, C) on an (H, W) grid -> (B, N, C), see SoftAttention.forward."""
        x = x + self.drop_path(self.attn(x, hw_shape, valid_shapes))
        x, mlp_out = self.mlp(x, norm=self.norm1)
        return self.norm2(x + self.drop_path(mlp_out))


class GlobalSoftmaxAttention(nn.Module):
    """Multi-head softmax attention over all tokens; ``qkv_bias``: projection bias."""

    def __init__(self, embed_dims: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by '
                             f'num_heads={num_heads}.')
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: torch.Tensor,
                key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, N, C) -> (B, N, C); ``key_mask`` (B, N) bool is False for padding."""
        queries = split_heads(self.q(x), self.num_heads)  # (B, h, N, d)
        keys, values = self.kv(x).chunk(2, dim=-1)
        keys = split_heads(keys, self.num_heads)
        values = split_heads(values, self.num_heads)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(  # (B, h, N, d)
            queries, keys, values, attn_mask=attn_mask)
        return self.proj(merge_heads(out))


class SoftmaxBlock(nn.Module):
    """Pre-norm ``x = x + attn(LN(x)); x = x + MLP(LN(x))`` with softmax attention.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        drop_path (float): Stochastic depth rate. Default: 0.
        qkv_bias (bool): Bias of the attention input projections. Default: True.
        norm_eps (float): LayerNorm epsilon. Default: 1e-6.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 drop_path: float = 0., qkv_bias: bool = True,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = GlobalSoftmaxAttention(embed_dims, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio))
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor, hw_shape=None,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, extra + H * W, C) -> same; masks grid tokens outside ``valid_shapes``."""
        key_mask = None
        if valid_shapes is not None:
            key_mask = grid_key_mask(x, hw_shape, valid_shapes)
        x = x + self.drop_path(self.attn(self.norm1(x), key_mask=key_mask))
        return x + self.drop_path(self.mlp(x, norm=self.norm2)[1])


def grid_key_mask(x: torch.Tensor, hw_shape, valid_shapes: ValidShapes) -> torch.Tensor:
    """(B, N) bool: True for the leading extra tokens and the valid grid tokens."""
    inside = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)  # (B, H*W)
    extra = x.new_ones(x.shape[0], x.shape[1] - inside.shape[1], dtype=torch.bool)
    return torch.cat((extra, inside), dim=1)


# --- Model
ARCH_SETTINGS = {
    'tiny': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                 depths=[1, 2, 3, 2]),
    # The reference code's depths, so that its checkpoints load.
    'small': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 20, 4]),
    'medium': dict(embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16],
                   depths=[1, 3, 29, 5]),
    'large': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 40, 5]),
    'huge': dict(embed_dims=[64, 128, 352, 512], num_heads=[2, 4, 11, 16],
                 depths=[1, 5, 49, 5]),
}
ARCH_DEFAULTS = dict(
    sr_ratios=[8, 4, 2, 1],
    local_kernel_sizes=[9, 5, 3],
    mlp_ratios=[4, 4, 4, 4],
    stem_channels=32,
)
NUM_STAGES = 4
#: The stage of tokens ``[cls; grid]``; ``pos_embeds[3]`` also holds cls's entry first.
CLASS_TOKEN_STAGE = NUM_STAGES - 1


class SOFT(DenseBackbone, Exportable):
    """SOFT / SOFT++ (Lu et al., NeurIPS 2021 / IJCV 2024).

    Four stages at strides 4-32 with conv patch embeddings and resized position
    embeddings: stages 1-3 run :class:`SoftBlock` s, stage 4 :class:`SoftmaxBlock` s
    with a class token, whose normalised state feeds the classifier ``head``.

    Args:
        arch (str | dict): ``'tiny'`` to ``'huge'``, or a dict of ``embed_dims``,
            ``num_heads``, ``depths`` (+ ``ARCH_DEFAULTS`` keys). Default: ``'tiny'``.
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``
            (``mmsoft.models.soft_kernels``). Default: ``'newton'``.
        newton_iters (int): Newton iterations. Default: 20.
        max_bottleneck_tokens (int, optional): Bottleneck cap; None: none. Default: 256.
        kernel_chunk_tokens (int, optional): Rows of ``K1`` held at a time by the
            memory-efficient path; None: all. Default: 16384.
        in_channels (int): Image channels. Default: 3.
        pretrain_img_size (int): Position embeddings' image size. Default: 224.
        out_indices (Sequence[int]): Stages (0-3) of the feature maps. Default: all.
        drop_rate (float): Dropout after the position embeddings. Default: 0.
        drop_path_rate (float): Stochastic depth, linear over blocks. Default: 0.1.
        memory_efficient (bool): Train through the memory-efficient path. Default: True.
        recompute_mlp (bool): MLPs recompute their hidden layer. Default: False.
        num_classes (int): Classifier outputs; 0: no classifier. Default: 0.
        global_pool (str): ``'token'`` (class token) or ``''``. Default: ``'token'``.

    Deprecated spellings: ``attention=`` (``variant=``), ``recompute_ffn=``
    (``recompute_mlp=``).
    """

    @accept_renamed(attention='variant', recompute_ffn='recompute_mlp')
    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 variant: str = 'soft++',
                 solver: str = 'newton',
                 newton_iters: int = 20,
                 max_bottleneck_tokens: Optional[int] = 256,
                 kernel_chunk_tokens: Optional[int] = 16384,
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 memory_efficient: bool = True,
                 recompute_mlp: bool = False,
                 num_classes: int = 0,
                 global_pool: str = 'token'):
        super().__init__(in_channels, out_indices, num_classes, global_pool, drop_rate,
                         drop_path_rate)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'num_heads', 'depths'), ARCH_DEFAULTS)
        check_lengths(settings, ('embed_dims', 'num_heads', 'depths', 'sr_ratios',
                                 'mlp_ratios'), NUM_STAGES)
        check_lengths(settings, ('local_kernel_sizes', ), NUM_STAGES - 1)
        check_divisible('embed_dims', settings['embed_dims'], 'num_heads',
                        settings['num_heads'])
        solver = check_kernel_inverse_options(variant, solver)
        check_positive_int('newton_iters', newton_iters)
        check_positive_int('max_bottleneck_tokens', max_bottleneck_tokens,
                           allow_none=True)
        check_positive_int('kernel_chunk_tokens', kernel_chunk_tokens,
                           allow_none=True)
        check_positive_int('pretrain_img_size', pretrain_img_size)
        self.arch_settings = settings
        self.variant = variant
        self.solver = solver
        self.embed_dims = list(settings['embed_dims'])
        self.num_features = self.head_hidden_size = self.embed_dims[-1]
        self.feature_info = [
            dict(num_chs=dims, reduction=2**(i + 2), module=f'stages.{i}')
            for i, dims in enumerate(self.embed_dims)]

        self.patch_embeds = nn.ModuleList(self._patch_embed(i) for i in range(4))
        self.pos_grids = [(pretrain_img_size // 2**(i + 2), ) * 2 for i in range(4)]
        self.pos_embeds = nn.ParameterList(
            nn.Parameter(torch.zeros(1, self.extra_tokens(i) + math.prod(grid), dims))
            for i, (grid, dims) in enumerate(zip(self.pos_grids, self.embed_dims)))
        self.pos_drop = nn.Dropout(drop_rate)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims[3]))

        depths = settings['depths']
        drop_path_rates = torch.linspace(0, drop_path_rate, sum(depths),
                                          device='cpu').tolist()
        attn_kwargs = dict(variant=variant, solver=solver,
                           newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        self.stages = nn.ModuleList()
        for i in range(NUM_STAGES):
            rates = drop_path_rates[sum(depths[:i]):sum(depths[:i + 1])]
            self.stages.append(nn.ModuleList(
                self._block(i, rate, attn_kwargs) for rate in rates))
        self.norm = nn.LayerNorm(self.embed_dims[3], eps=1e-6)
        self.head = self._classifier(num_classes)
        self.select_memory_path(memory_efficient, recompute_mlp)
        self._init_from_scratch()

    def _patch_embed(self, stage: int) -> ConvPatchEmbed:
        """Stage 1: three convs (strides 2, 1, 2); later stages: one stride-2 conv."""
        dims = self.embed_dims[stage]
        if stage == 0:
            stem = self.arch_settings['stem_channels']
            return ConvPatchEmbed([self.in_channels, stem, stem, dims], [2, 1, 2])
        return ConvPatchEmbed([self.embed_dims[stage - 1], dims], [2])

    def _block(self, stage: int, drop_path: float, attn_kwargs: dict) -> nn.Module:
        settings = self.arch_settings
        dims, heads = self.embed_dims[stage], settings['num_heads'][stage]
        mlp_ratio = settings['mlp_ratios'][stage]
        if stage == NUM_STAGES - 1:
            return SoftmaxBlock(dims, heads, mlp_ratio, drop_path)
        return SoftBlock(dims, heads, settings['sr_ratios'][stage],
                         settings['local_kernel_sizes'][stage], mlp_ratio,
                         drop_path, **attn_kwargs)

    def init_weights(self) -> None:
        """Initialises every parameter from scratch."""
        self._init_from_scratch()

    def _init_from_scratch(self) -> None:
        """Truncated-normal position embeddings, class token and Linear weights."""
        for pos_embed in self.pos_embeds:
            nn.init.trunc_normal_(pos_embed, std=.02)
        nn.init.trunc_normal_(self.cls_token, std=.02)
        self.apply(init_transformer_weights)

    @staticmethod
    def extra_tokens(stage: int) -> int:
        """Tokens before the grid: 1 (the class token) in :data:`CLASS_TOKEN_STAGE`."""
        return int(stage == CLASS_TOKEN_STAGE)

    def stage_pos_embed(self, stage: int, hw_shape: Tuple[int, int],
                        valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Position embeddings at ``hw_shape``, cls first: (1 or B, extra + H*W, C)."""
        extra = self.extra_tokens(stage)
        pos_embed = self.pos_embeds[stage]
        grid_embed = pos_embed[:, extra:]
        if valid_shapes is None:
            # Exported, the resize runs on every grid, its own included.
            resize = interpolate_pos_embed if self.exportable else resize_pos_embed
            grid = resize(grid_embed, self.pos_grids[stage], hw_shape)
        else:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grids[stage],
                                               hw_shape, valid_shapes)
        if not extra:
            return grid
        extra_embed = pos_embed[:, :extra].expand(grid.shape[0], -1, -1)
        return torch.cat((extra_embed, grid), dim=1)

    def stage_tokens(self, stage: int, patches: torch.Tensor, hw_shape: Tuple[int, int],
                     valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """[cls;] patches (B, H * W, C) + position embeddings: (B, extra + N, C)."""
        if self.extra_tokens(stage):
            cls_token = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, C)
            patches = torch.cat((cls_token, patches), dim=1)
        pos_embed = self.stage_pos_embed(stage, hw_shape, valid_shapes)
        return self.pos_drop(patches + pos_embed)

    def run_stages(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                   indices: Sequence[int] = (), last_stage: int = NUM_STAGES - 1
                   ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """Stages 0..``last_stage``; padded tokens (``valid_shapes``) are ignored.

        Returns:
            tuple[list[Tensor], Tensor]: Maps of ``indices``, (B, C_i, H_i, W_i) at
            stride 2**(i + 2), and the last tokens (B, extra + N, C).
        """
        maps = []
        for i in range(last_stage + 1):
            x, hw_shape = self.patch_embeds[i](x, valid_shapes)  # (B, N, C)
            if valid_shapes is not None:
                valid_shapes = self.patch_embeds[i].output_shapes(valid_shapes)
            tokens = self.stage_tokens(i, x, hw_shape, valid_shapes)  # (B, extra+N, C)
            for block in self.stages[i]:
                tokens = self.run_block(block, tokens, hw_shape, valid_shapes)
            if i == NUM_STAGES - 1:
                tokens = self.norm(tokens)
            x = tokens[:, self.extra_tokens(i):]  # the grid's tokens, (B, N, C)
            x = mask_map(tokens_to_map(x, hw_shape), valid_shapes)  # (B, C, H, W)
            if i in indices:
                maps.append(x)
        return maps, tokens

    def forward_maps(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                     indices: Sequence[int]) -> List[torch.Tensor]:
        return self.run_stages(x, valid_shapes, indices, last_stage=max(indices))[0]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised stage-4 tokens, class token first: (B, 1 + N, C)."""
        self.check_input(x)
        return self.run_stages(x, None)[1]

    def forward_intermediates(self, x: torch.Tensor, indices=None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = 'NCHW',
                              intermediates_only: bool = False, valid_shapes=None):
        if intermediates_only:
            return super().forward_intermediates(
                x, indices, norm, stop_early, output_fmt, True, valid_shapes)
        shapes = self.check_input(x, valid_shapes)
        maps, tokens = self.run_stages(x, shapes, take_indices(indices, NUM_STAGES))
        return tokens, maps

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, 1 + N, C) -> logits (B, num_classes), or features (B, C)."""
        if self.global_pool == 'token':
            x = x[:, 0]
        return x if pre_logits else self.head(x)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new classifier of ``num_classes`` outputs (0: none)."""
        self.num_classes = num_classes
        if global_pool is not None:
            check_choice('global_pool', global_pool, ('token', ''))
            self.global_pool = global_pool
        self.head = self._classifier(num_classes)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drops the classifier (``prune_head``); returns the kept indices."""
        if prune_head:
            self.reset_classifier(0, '')
        return take_indices(indices, NUM_STAGES)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {'cls_token'} | {f'pos_embeds.{i}' for i in range(NUM_STAGES)}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r'^cls_token|^pos_embeds\.0|^patch_embeds\.0',
                    blocks=r'^stages\.(\d+)' if coarse else
                    [(r'^stages\.(\d+)\.(\d+)', None), (r'^norm', (99999, ))])


# --- Official checkpoints
def checkpoint_filter_fn(state_dict: dict, model: SOFT) -> dict:
    """An official SOFT / SOFT++ checkpoint (fudan-zvg/SOFT) in :class:`SOFT`'s layout.

    A converted dict passes as is; ``head.*`` is kept if ``model`` has a classifier.
    """
    from ..checkpoint.soft_official import soft_official_to_mmsoft
    if 'patch_embeds.0.proj.0.weight' in state_dict:
        return state_dict
    converted, _ = soft_official_to_mmsoft(state_dict, variant=model.variant)
    if isinstance(model.head, nn.Linear):
        converted.update({key: state_dict[key] for key in ('head.weight', 'head.bias')})
    return converted
