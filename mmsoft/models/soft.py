"""SOFT / SOFT++: softmax-free transformers with linear complexity.

Lu et al., NeurIPS 2021 and IJCV 2024. Attention is a Gaussian kernel with
shared queries and keys, low-rank through bottleneck tokens L:
``K1 . middle . (K1^T V)``, ``K1 = k(Q, L)``, ``middle`` the inverse of
``A = k(L, L)``: ``(A + 0.01 I)^-1`` (SOFT) or ``D^-1/2 pinv(A) D^-1/2``,
``D = diag(A 1)`` (SOFT++), by Newton's iteration as the papers, in closed
form or exactly (docs/soft_design.md).
"""
import math
from functools import partial
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoint.soft_official import soft_official_to_mmsoft
from ..deployment.traceable import averaging_matrix, traceable_cap_bottleneck_grid
# gaussian_kernel and kernel_inverse, the inverse's solvers, for the tools.
from ..ops.kernel_inverse import (SOLVERS, VARIANTS, gaussian_kernel,  # noqa: F401
                                  kernel_inverse)
from ..ops.layer_norm import layer_norm_mlp
from ..ops.soft import soft_attention
from ..utils.validation import (check_choice, check_divisible, check_lengths,
                                check_positive_int, resolve_arch)
from .common import (MLP, ConvPatchEmbed, DenseBackbone, DropPath, Regions,
                     ValidShapes, full_precision, gelu, init_transformer_weights,
                     merge_heads, pad_to_grid, per_distinct_shape, recomputed,
                     regions_on_grid, split_heads, take_indices, tokens_as_map,
                     tokens_to_map)

#: The solver an ONNX graph computes for each solver ONNX can express.
EXPORT_SOLVERS = {'newton': 'newton', 'newton_closed_form': 'newton'}


# --- Attention
def capped_grid_size(height: int, width: int,
                     max_tokens: Optional[int]) -> Tuple[int, int]:
    """The largest grid with the aspect of ``height x width`` and at most
    ``max_tokens`` cells."""
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
    """A grid (B, d, h, w) average-pooled to at most ``max_tokens`` cells."""
    size = capped_grid_size(grid.shape[-2], grid.shape[-1], max_tokens)
    if size == tuple(grid.shape[-2:]):
        return grid
    return F.adaptive_avg_pool2d(grid, size)


def pooling_matrix(cells: List[Tuple[int, int]], grid: Tuple[int, int],
                   max_tokens: Optional[int]) -> Tuple[torch.Tensor, List[int]]:
    """Each image's bottleneck tokens as rows of a (B, m, H * W) matrix on the
    CPU, and their counts: image i's first (rows, cols) cells of the (H, W) grid
    average-pooled to at most ``max_tokens`` (:func:`capped_grid_size`), rows
    past its count zero."""
    def averaging(cells: int, tokens: int, size: int) -> torch.Tensor:  # (tokens, size)
        return F.pad(averaging_matrix(cells, tokens, torch.float64), (0, size - cells))

    pools = [torch.kron(averaging(rows, out_rows, grid[0]),
                        averaging(cols, out_cols, grid[1]))  # (c, H * W)
             for (rows, cols), (out_rows, out_cols) in zip(
                 cells, [capped_grid_size(*cell, max_tokens) for cell in cells])]
    counts = [pool.shape[0] for pool in pools]
    return torch.stack([F.pad(pool, (0, 0, 0, max(counts) - count))
                        for pool, count in zip(pools, counts)]), counts


def linear_to_map(x: torch.Tensor, layer: nn.Linear, hw_shape) -> torch.Tensor:
    """``layer`` on tokens (B, N, C_in) as ``W x^T + b``: an NCHW map (B, C_out,
    H, W)."""
    batch, tokens, _ = x.shape
    weight = layer.weight.expand(batch, -1, -1)  # (B, C_out, C_in)
    bias = layer.bias[:, None].expand(batch, -1, tokens)  # (B, C_out, N)
    return torch.baddbmm(bias, weight, x.transpose(1, 2)).view(batch, -1, *hw_shape)


class SoftAttention(nn.Module):
    """Softmax-free attention: ``proj(K1 . middle . (K1^T V) + DWConv(V))``.

    Queries double as keys, ``Q = d^-1/4 Q0``. The bottleneck tokens L come from
    a stride-``sr_ratio`` convolution shared by the heads, LayerNorm and GELU,
    average-pooled to at most ``max_bottleneck_tokens`` (None: no cap).
    ``kernel_chunk_tokens`` bounds the rows of K1 the training implementation
    holds (``memory_efficient``: :func:`~mmsoft.ops.soft.soft_attention`)."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int, sr_ratio: int,
                 local_kernel_size: int, variant: str = 'soft', solver: str = 'newton',
                 newton_iters: int = 20, max_bottleneck_tokens: Optional[int] = None,
                 kernel_chunk_tokens: Optional[int] = None):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by '
                             f'num_heads={num_heads}.')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.scale = self.head_dims**-0.25  # Q = scale * Q0
        self.variant = variant
        check_choice('variant', variant, VARIANTS)
        check_choice('solver', solver, SOLVERS)
        self.solver = solver
        self.newton_iters = newton_iters
        self.max_bottleneck_tokens = max_bottleneck_tokens
        self.kernel_chunk_tokens = kernel_chunk_tokens
        self.exportable = False

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.bottleneck_conv = nn.Conv2d(self.head_dims, self.head_dims, sr_ratio,
                                         stride=sr_ratio, bias=False)
        self.bottleneck_norm = nn.LayerNorm(self.head_dims)
        self.local_conv = nn.Conv2d(num_heads, num_heads, local_kernel_size,
                                    padding=local_kernel_size // 2, groups=num_heads,
                                    bias=False)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: torch.Tensor, hw_shape,
                regions: Optional[Regions] = None) -> torch.Tensor:
        """Tokens (B, N, C) on the (H, W) grid -> (B, N, C); each image attends
        within its region (outside it the outputs are meaningless)."""
        query_map, value_map = self.project(x, hw_shape, regions)  # (B, C, H, W)
        bottleneck, counts, inside = self.bottleneck_tokens(query_map, regions)  # L
        out = soft_attention(self.heads(query_map), bottleneck, self.heads(value_map),
                             self.scale, self.variant, self.solver_to_run(),
                             self.newton_iters, counts, inside,
                             chunk_tokens=self.kernel_chunk_tokens,
                             fused=self.memory_efficient)  # (B, h, N, d)
        return self.output(out, value_map)

    def project(self, x: torch.Tensor, hw_shape, regions: Optional[Regions]):
        """Q0 and V as NCHW maps (B, C, H, W), V zero outside the regions."""
        query_map = linear_to_map(x, self.q_proj, hw_shape)
        value_map = linear_to_map(x, self.v_proj, hw_shape)
        if regions is not None:
            value_map = value_map.masked_fill(regions.padding, 0.)
        return query_map, value_map

    def heads(self, feature_map: torch.Tensor) -> torch.Tensor:
        """A map (B, h * d, H, W) as heads of tokens (B, h, H * W, d), float32."""
        batch, channels = feature_map.shape[:2]
        heads = feature_map.reshape(batch, self.num_heads, channels // self.num_heads,
                                    -1)
        return full_precision(heads.transpose(-1, -2))

    def bottleneck_tokens(self, query_map: torch.Tensor,
                          regions: Optional[Regions] = None):
        """L (B, h, m, d) of the map of Q (B, h * d, H, W), each image's count and
        the mask of its tokens (B, m) (None without ``regions``).

        With ``regions``, image i's tokens pool its region alone; they are the
        first c_i of the m, the others pad.
        """
        # One convolution shared by the heads: each head's map as an image.
        batch, _, height, width = query_map.shape
        grid = self.bottleneck_conv(query_map.reshape(
            -1, self.head_dims, height, width))  # (B h, d, H', W')
        grid = grid.reshape(batch, -1, *grid.shape[-2:])  # (B, h d, H', W')
        if regions is None:  # one pooling for the batch; in export on traced sizes
            cap = (traceable_cap_bottleneck_grid if self.exportable
                   else cap_bottleneck_grid)
            tokens = cap(grid, self.max_bottleneck_tokens).flatten(2).transpose(1, 2)
            tokens = self.scale * tokens  # (B, m, h d)
            counts = inside = None
        else:
            pool, counts, inside = self.pooling(grid, regions)
            tokens = torch.matmul(pool, grid.flatten(2).transpose(1, 2))  # (B, m, h d)

        tokens = tokens.reshape(*tokens.shape[:2], self.num_heads, self.head_dims)
        bottleneck = gelu(self.bottleneck_norm(tokens)).transpose(1, 2)  # (B, h, m, d)
        return full_precision(bottleneck), counts, inside

    def pooling(self, grid: torch.Tensor, regions: Regions):
        """The bottleneck pooling of a grid (B, h d, H', W') in regions, as a
        matrix (B, m, H' W') times the query scale, with each image's token
        count and the mask of its tokens (B, m); made once per grid."""
        stride = self.bottleneck_conv.stride[0]
        key = ('bottleneck pooling', stride, self.max_bottleneck_tokens, self.scale,
               grid.dtype)
        if key in regions.cache:
            return regions.cache[key]

        cells = [(height // stride, width // stride)
                 for height, width in regions.shapes]
        if not all(rows and cols for rows, cols in cells):
            raise ValueError(
                f'valid_shapes={regions.shapes} holds a region too small for the '
                f'bottleneck convolution of stride {stride}; expected every region '
                f'to span at least {stride} x {stride} cells of each grid.')
        pool, counts = pooling_matrix(cells, tuple(grid.shape[-2:]),
                                      self.max_bottleneck_tokens)
        index = torch.arange(pool.shape[1])
        inside = torch.stack([index < count for count in counts])  # (B, m)
        # Made on the CPU, copied to the device without waiting for it.
        regions.cache[key] = (
            (pool * self.scale).to(grid.device, grid.dtype, non_blocking=True), counts,
            inside.to(grid.device, full_precision(grid).dtype, non_blocking=True))
        return regions.cache[key]

    def solver_to_run(self) -> str:
        """The solver; in the ONNX formulation, the one ONNX can express."""
        if self.exportable:
            return EXPORT_SOLVERS.get(self.solver, self.solver)
        return self.solver

    def output(self, out: torch.Tensor, value_map: torch.Tensor) -> torch.Tensor:
        """``proj(global + DWConv(V))`` from the global term (B, h, N, d)."""
        weight = self.local_conv.weight.repeat_interleave(self.head_dims, dim=0)
        local = F.conv2d(value_map, weight, padding=self.local_conv.padding,
                         groups=weight.shape[0])  # (B, C, H, W)

        out = merge_heads(out.to(local.dtype)) + local.flatten(2).transpose(1, 2)
        return self.out_proj(out)  # (B, N, C)


# --- Blocks
#: GELU with the tanh approximation, as SOFT's reference code.
TanhGELU = partial(nn.GELU, approximate='tanh')


class SoftBlock(nn.Module):
    """Post-norm ``x = LN(x + attn(x)); x = LN(x + MLP(x))`` with SOFT attention
    (``attn_kwargs``: :class:`SoftAttention`'s)."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int, sr_ratio: int,
                 local_kernel_size: int, mlp_ratio: float = 4., drop_path: float = 0.,
                 **attn_kwargs):
        super().__init__()
        self.attn = SoftAttention(embed_dims, num_heads, sr_ratio, local_kernel_size,
                                  **attn_kwargs)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio), act_layer=TanhGELU)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw_shape, regions: Optional[Regions] = None,
                drop_masks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, N, C) on the (H, W) grid -> (B, N, C); ``drop_masks`` (2, B): the
        branches' stochastic-depth masks."""
        masks = (None, None) if drop_masks is None else drop_masks
        # x + drop_path(attn(x)), as drop_path.add_to(x, ...) throughout
        x = self.drop_path.add_to(x, self.attn(x, hw_shape, regions), masks[0])
        # x = norm1(x), then MLP(x), as one op that keeps norm1's input alone.
        x, mlp_out = layer_norm_mlp(x, self.norm1, self.mlp,
                                    fused=self.memory_efficient)
        return self.norm2(self.drop_path.add_to(x, mlp_out, masks[1]))


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
        keys, values = (split_heads(t, self.num_heads) for t in self.kv(x).chunk(2, -1))
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask)
        return self.proj(merge_heads(out))


def grid_key_mask(x: torch.Tensor,
                  regions: Optional[Regions]) -> Optional[torch.Tensor]:
    """(B, N) bool: True for the leading extra tokens and the grid tokens inside
    the regions; None without regions."""
    if regions is None:
        return None
    inside = ~regions.padding.flatten(1)  # (B, H * W)
    extra = inside.new_ones(x.shape[0], x.shape[1] - inside.shape[1])
    return torch.cat((extra, inside), dim=1)


class SoftmaxBlock(nn.Module):
    """Pre-norm ``x = x + attn(LN(x)); x = x + MLP(LN(x))`` with softmax attention."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 drop_path: float = 0., qkv_bias: bool = True, norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = GlobalSoftmaxAttention(embed_dims, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw_shape=None, regions: Optional[Regions] = None,
                drop_masks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, extra + H * W, C) -> the same; grid tokens outside the regions are
        no keys; ``drop_masks`` (2, B): the branches' stochastic-depth masks."""
        masks = (None, None) if drop_masks is None else drop_masks
        # x + drop_path(attn(norm1(x))), as drop_path.add_to(x, ...) throughout
        attended = self.attn(self.norm1(x), grid_key_mask(x, regions))
        x = self.drop_path.add_to(x, attended, masks[0])
        mlp_out = layer_norm_mlp(x, self.norm2, self.mlp,
                                 fused=self.memory_efficient)[1]
        return self.drop_path.add_to(x, mlp_out, masks[1])


# --- Position embeddings
def interpolate_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                          dst_shape: Tuple[int, int]) -> torch.Tensor:
    """Position embeddings (1, Hs * Ws, C) resampled bilinearly to (1, H * W, C)."""
    grid = pos_embed.reshape(1, *src_shape, pos_embed.shape[-1]).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_shape, mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                     dst_shape: Tuple[int, int]) -> torch.Tensor:
    """:func:`interpolate_pos_embed`, or ``pos_embed`` itself at its own size."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    return interpolate_pos_embed(pos_embed, src_shape, dst_shape)


def resize_pos_embed_to_regions(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                                hw_shape: Tuple[int, int],
                                valid_shapes: ValidShapes) -> torch.Tensor:
    """Embeddings (1, Hs * Ws, C) resized to each region: (B, H * W, C), zero
    outside."""
    resized = per_distinct_shape(  # (1, h * w, C) each
        lambda shape: resize_pos_embed(pos_embed, src_shape, shape), valid_shapes)
    grids = [resized[shape].unflatten(1, shape).movedim(-1, 1)  # (1, C, h, w)
             for shape in valid_shapes]
    padded = torch.cat([pad_to_grid(grid, hw_shape) for grid in grids])  # (B, C, H, W)
    return padded.flatten(2).transpose(1, 2)


# --- Stage
class SoftStage(nn.Module):
    """One stage: patch embedding, position embeddings learned on ``pos_grid``
    and resized to each grid, blocks, and with ``class_token`` (the last
    stage) a class token and a final LayerNorm."""

    def __init__(self, patch_embed: ConvPatchEmbed, blocks: Sequence[nn.Module],
                 embed_dims: int, pos_grid: Tuple[int, int], class_token: bool = False,
                 drop_rate: float = 0.):
        super().__init__()
        self.patch_embed = patch_embed
        self.pos_grid = tuple(pos_grid)
        self.extra_tokens = int(class_token)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.extra_tokens + math.prod(pos_grid), embed_dims))
        if class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)

        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(embed_dims, eps=1e-6) if class_token else nn.Identity()
        self.grad_checkpointing = False
        self.exportable = False

    def forward(self, x: torch.Tensor, regions: Optional[Regions] = None,
                drop_masks: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int], Optional[Regions]]:
        """A map (B, C_in, H_in, W_in) -> tokens (B, extra + H * W, C), the grid
        (H, W) and its regions; cells outside the input's ``regions`` are
        ignored. ``drop_masks`` (blocks, 2, B): the blocks' stochastic-depth masks."""
        patches, hw_shape, regions = self.patch_embed(x, regions)  # (B, N, C)
        valid_shapes = None if regions is None else regions.shapes

        if self.extra_tokens:
            cls_token = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, C)
            patches = torch.cat((cls_token, patches), dim=1)
        tokens = self.pos_drop(patches
                               + self.position_embeddings(hw_shape, valid_shapes))

        for i, block in enumerate(self.blocks):
            masks = None if drop_masks is None else drop_masks[i]
            if self.grad_checkpointing and self.training and tokens.requires_grad:
                tokens = recomputed(block, tokens, hw_shape, regions, masks)
            else:
                tokens = block(tokens, hw_shape, regions, masks)
        return self.norm(tokens), hw_shape, regions

    def position_embeddings(self, hw_shape: Tuple[int, int],
                            valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """The embeddings at ``hw_shape`` (per region), class token's first:
        (1 or B, extra + H * W, C). The ONNX formulation resizes every grid."""
        grid_embed = self.pos_embed[:, self.extra_tokens:]
        if valid_shapes is not None:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grid, hw_shape,
                                               valid_shapes)
        elif self.exportable:
            grid = interpolate_pos_embed(grid_embed, self.pos_grid, hw_shape)
        else:
            grid = resize_pos_embed(grid_embed, self.pos_grid, hw_shape)
        if not self.extra_tokens:
            return grid

        extra_embed = self.pos_embed[:, :self.extra_tokens]
        extra_embed = extra_embed.expand(grid.shape[0], -1, -1)
        return torch.cat((extra_embed, grid), dim=1)


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
ARCH_DEFAULTS = dict(sr_ratios=[8, 4, 2, 1], local_kernel_sizes=[9, 5, 3],
                     mlp_ratios=[4, 4, 4, 4], stem_channels=32)
NUM_STAGES = 4
#: The stage of tokens ``[cls; grid]``.
CLASS_TOKEN_STAGE = NUM_STAGES - 1


class SOFT(DenseBackbone):
    """SOFT / SOFT++ (Lu et al., NeurIPS 2021 / IJCV 2024).

    Four :class:`SoftStage` s at strides 4-32: stages 1-3 run :class:`SoftBlock` s,
    stage 4 :class:`SoftmaxBlock` s with a class token, whose normalised state
    feeds the classifier ``head``.

    Args:
        arch (str | dict): ``'tiny'`` to ``'huge'``, or a dict of ``embed_dims``,
            ``num_heads``, ``depths`` (and ``ARCH_DEFAULTS``' keys).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
        max_bottleneck_tokens (int, optional): The bottleneck cap; None: none.
        kernel_chunk_tokens (int, optional): Rows of K1 the memory-saving path
            holds at a time; None: all.
        pretrain_img_size (int): The position embeddings' image size.
        memory_efficient (bool): Train through the ops' training implementations,
            which keep less for backward (False: plain autograd throughout).
        recompute_mlp (bool): The MLPs recompute their hidden layer too.
        global_pool (str): ``'token'`` (the class token) or ``''``."""

    family = 'SOFT'

    def __init__(self, arch: Union[str, dict] = 'tiny', variant: str = 'soft++',
                 solver: str = 'newton', newton_iters: int = 20,
                 max_bottleneck_tokens: Optional[int] = 256,
                 kernel_chunk_tokens: Optional[int] = 16384, in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_rate: float = 0., drop_path_rate: float = 0.1,
                 memory_efficient: bool = True, recompute_mlp: bool = False,
                 num_classes: int = 0, global_pool: str = 'token'):
        super().__init__(in_channels, out_indices, num_classes, global_pool, drop_rate,
                         drop_path_rate)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'num_heads', 'depths'), ARCH_DEFAULTS)
        check_lengths(settings, ('embed_dims', 'num_heads', 'depths', 'sr_ratios',
                                 'mlp_ratios'), NUM_STAGES)
        check_lengths(settings, ('local_kernel_sizes', ), NUM_STAGES - 1)
        check_divisible('embed_dims', settings['embed_dims'], 'num_heads',
                        settings['num_heads'])
        check_choice('variant', variant, VARIANTS)
        check_choice('solver', solver, SOLVERS)
        check_positive_int('newton_iters', newton_iters)
        check_positive_int('max_bottleneck_tokens', max_bottleneck_tokens,
                           allow_none=True)
        check_positive_int('kernel_chunk_tokens', kernel_chunk_tokens, allow_none=True)
        check_positive_int('pretrain_img_size', pretrain_img_size)

        self.arch_settings = settings
        self.variant = variant
        self.solver = solver
        self.embed_dims = list(settings['embed_dims'])
        self.num_features = self.head_hidden_size = self.embed_dims[-1]
        self.feature_info = [dict(num_chs=dims, reduction=2**(i + 2),
                                  module=f'stages.{i}')
                             for i, dims in enumerate(self.embed_dims)]

        depths = settings['depths']
        rates = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()
        attn_kwargs = dict(variant=variant, solver=solver, newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        patch_embeds = [self._patch_embed(i) for i in range(NUM_STAGES)]
        self.stages = nn.ModuleList()
        for i, dims in enumerate(self.embed_dims):
            stage_rates = rates[sum(depths[:i]):sum(depths[:i + 1])]
            blocks = [self._block(i, rate, attn_kwargs) for rate in stage_rates]
            pos_grid = (pretrain_img_size // 2**(i + 2), ) * 2
            self.stages.append(SoftStage(patch_embeds[i], blocks, dims, pos_grid,
                                         class_token=i == CLASS_TOKEN_STAGE,
                                         drop_rate=drop_rate))
        self.head = self._classifier(num_classes)
        self.register_drop_paths(rates, branches=2)
        self.select_memory_path(memory_efficient, recompute_mlp)
        self._init_from_scratch()

    def _patch_embed(self, stage: int) -> ConvPatchEmbed:
        """Stage 1: three convolutions (strides 2, 1, 2); later stages one of
        stride 2."""
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
                         settings['local_kernel_sizes'][stage], mlp_ratio, drop_path,
                         **attn_kwargs)

    def _init_from_scratch(self) -> None:
        """Truncated-normal position embeddings, class token and Linear weights."""
        for name, param in self.named_parameters():
            if name.endswith(('.pos_embed', '.cls_token')):
                nn.init.trunc_normal_(param, std=.02)
        self.apply(init_transformer_weights)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised stage-4 tokens, class token first: (B, 1 + N, C)."""
        self.check_input(x)
        for stage, masks in zip(self.stages, self.stage_drop_masks(x.shape[0])):
            tokens, hw_shape, _ = stage(x, None, masks)
            x = tokens_as_map(tokens[:, stage.extra_tokens:], hw_shape)  # a view
        return tokens

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, 1 + N, C) -> logits (B, num_classes), or features (B, C)."""
        if self.global_pool == 'token':
            x = x[:, 0]
        return x if pre_logits else self.head(x)

    def forward_intermediates(self, x: torch.Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW',
                              intermediates_only: bool = False,
                              valid_shapes: Optional[Sequence] = None):
        """timm's feature API: the NCHW maps of ``indices`` (strides 4-32) in one
        pass, zero outside ``valid_shapes`` (each image's (h, w) in a padded
        batch); with ``intermediates_only`` (or ``stop_early``) it stops after the
        last stage asked for. Returns the maps, or the last tokens and the maps."""
        valid_shapes, indices = self.intermediates_request(x, indices, output_fmt,
                                                           valid_shapes)

        last = max(indices) if stop_early or intermediates_only else NUM_STAGES - 1
        maps = []
        drop_masks = self.stage_drop_masks(x.shape[0])
        regions = regions_on_grid(valid_shapes, x.shape[-2:], x.device)
        for i, stage in enumerate(self.stages[:last + 1]):
            tokens, hw_shape, regions = stage(x, regions, drop_masks[i])
            grid = tokens[:, stage.extra_tokens:]  # (B, N, C)
            if i in indices:  # contiguous NCHW, zero outside the regions
                feature = tokens_to_map(grid, hw_shape)
                if regions is not None:
                    feature = feature.masked_fill(regions.padding, 0.)
                maps.append(feature)
            x = tokens_as_map(grid, hw_shape)  # the next stage's input, a view
        return maps if intermediates_only else (tokens, maps)

    def stage_drop_masks(self, batch: int) -> List[Optional[torch.Tensor]]:
        """Each stage's share of :meth:`drop_path_masks`: (blocks, 2, B) or None."""
        masks = self.drop_path_masks(batch)
        shares, start = [], 0
        for stage in self.stages:
            end = start + len(stage.blocks)
            shares.append(None if masks is None else masks[start:end])
            start = end
        return shares

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new classifier of ``num_classes`` outputs (0: none)."""
        self.num_classes = num_classes
        if global_pool is not None:
            check_choice('global_pool', global_pool, ('token', ''))
            self.global_pool = global_pool
        self.head = self._classifier(num_classes)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drops the stages after the last of ``indices`` and (``prune_head``)
        the classifier; returns the kept indices."""
        kept = take_indices(indices, len(self.stages))
        del self.stages[max(kept) + 1:]
        self.feature_info = self.feature_info[:max(kept) + 1]
        if prune_head:
            self.reset_classifier(0, '')
        return kept

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {name for name, _ in self.named_parameters()
                if name.endswith(('.pos_embed', '.cls_token'))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r'^stages\.0\.(?:patch_embed|pos_embed)',
                    blocks=r'^stages\.(\d+)' if coarse else
                    [(r'^stages\.(\d+)\.blocks\.(\d+)', None),
                     (r'^stages\.(\d+)\.', None)])


def set_exportable(model: nn.Module, enabled: bool) -> nn.Module:
    """Switches the ONNX formulation of every SOFT layer; returns ``model``."""
    if not isinstance(enabled, bool):
        raise ValueError(f'enabled={enabled!r} is invalid; expected True or False.')
    for module in model.modules():
        if isinstance(module, (SoftAttention, SoftStage)):
            module.exportable = enabled
    return model


def checkpoint_filter_fn(state_dict: dict, model: SOFT) -> dict:
    """An official SOFT / SOFT++ checkpoint (fudan-zvg/SOFT) in :class:`SOFT`'s
    layout; one in mmsoft's layout (or an earlier one) passes as it is.
    ``head.*`` is kept where ``model`` has a classifier."""
    ours = {'stages.0.patch_embed.proj.0.weight', 'patch_embeds.0.proj.0.weight'}
    if ours & set(state_dict):
        return state_dict
    converted, _ = soft_official_to_mmsoft(state_dict, variant=model.variant)
    if isinstance(model.head, nn.Linear):
        converted.update({key: state_dict[key] for key in ('head.weight', 'head.bias')})
    return converted
