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

from ..checkpoint.soft_official import soft_official_to_mmsoft
from ..deployment.traceable import traceable_cap_bottleneck_grid
from ..deprecations import accepts_renamed_arguments
from ..utils.torch_compat import autocast_off
from ..utils.validation import (check_choice, check_divisible, check_lengths,
                                check_positive_int, resolve_arch)
from .functional import (ValidShapes, contiguous_gradient, full_precision, gelu,
                         mask_map, merge_heads, pad_to_grid, per_distinct_shape,
                         run_block, split_heads, valid_mask)
from .layers import (MLP, ConvPatchEmbed, DenseBackbone, MemoryEfficient,
                     drop_path_or_identity, init_transformer_weights, run_mode,
                     switch_modules, take_indices, tokens_as_map,
                     tokens_to_map)
from .soft_kernels import (EXPORT_SOLVERS, check_kernel_inverse_options,
                           low_rank_kernel_attention, memory_efficient_kernel_attention)


# --- Export formulation
class Exportable:
    """Mixin: ``exportable`` (:func:`set_exportable`) makes the layer bind, in
    ``choose_formulation``, the functions of its ONNX formulation or eager ones."""

    exportable = run_mode('choose_formulation', False)


def set_exportable(model: nn.Module, enabled: bool) -> nn.Module:
    """Switches the ONNX formulation of all ``Exportable`` modules."""
    return switch_modules(model, Exportable, 'exportable', enabled, 'enabled')


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


# --- Valid regions of one image
def region_tokens_to_grid(tokens: torch.Tensor, shape: Tuple[int, int],
                          hw_shape: Sequence[int]) -> torch.Tensor:
    """Tokens (..., h * w, C) of a top-left (h, w) region -> (..., H * W, C) of the
    (H, W) grid, zero outside the region."""
    grid = tokens.unflatten(-2, tuple(shape)).movedim(-1, -3)  # (..., C, h, w)
    return pad_to_grid(grid, hw_shape).flatten(-2).transpose(-1, -2)


# --- SOFT attention
class SoftAttention(MemoryEfficient, Exportable, nn.Module):
    """Softmax-free attention: ``out = proj(K1 . middle . (K1^T V) + DWConv(V))``.

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

    @accepts_renamed_arguments
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
        self.exportable = False

    def choose_formulation(self, exportable: bool) -> None:
        """Eager: the bottleneck cap on Python sizes and the solver built; ONNX:
        the cap as matrix products and the solver ONNX expresses."""
        self.cap_grid = (traceable_cap_bottleneck_grid if exportable
                         else cap_bottleneck_grid)
        self.solver_to_run = (EXPORT_SOLVERS.get(self.solver, self.solver) if exportable
                              else self.solver)

    def bottleneck_tokens(self, query_map: torch.Tensor,
                          scale: float) -> torch.Tensor:
        """Bottleneck tokens L (B, h, m, d) of ``scale`` * Q0 map (B, h * d, H, W)."""
        batch = query_map.shape[0]
        weight = self.bottleneck_conv.weight.repeat(self.num_heads, 1, 1, 1)
        grid = F.conv2d(query_map, weight, stride=self.bottleneck_conv.stride,
                        groups=self.num_heads)  # (B, h*d, H/r, W/r)
        grid = self.cap_grid(grid, self.max_bottleneck_tokens)  # h'w' <= cap
        bottleneck = grid.reshape(batch, self.num_heads, self.head_dims, -1)
        # LayerNorm's input and gradient contiguous, for the compiler's stride model.
        bottleneck = (bottleneck.transpose(-1, -2) * scale).contiguous()  # (B, h, m, d)
        return contiguous_gradient(gelu(self.bottleneck_norm(bottleneck)))  # L

    def global_term(self, query_map: torch.Tensor,
                    value_map: torch.Tensor) -> torch.Tensor:
        """``K1 . middle . (K1^T V)`` of one grid in full precision: Q0 and V
        maps (B, h * d, H, W) -> (B, h, H * W, d)."""
        scale = self.head_dims**-0.25  # Q = scale * Q0
        bottleneck = self.bottleneck_tokens(query_map, scale)  # L: (B, h, m, d)
        queries = map_heads(query_map, self.num_heads)  # Q0: (B, h, N, d)
        values = map_heads(value_map, self.num_heads)  # V: (B, h, N, d)
        kernel_attention = (self.memory_efficient_attention if self.saving_memory()
                            else low_rank_kernel_attention)
        with autocast_off(query_map.device.type):
            return kernel_attention(full_precision(queries), full_precision(bottleneck),
                                    full_precision(values), self.variant,
                                    self.solver_to_run, self.newton_iters,
                                    query_scale=scale)

    def global_term_per_image(self, query_map: torch.Tensor, value_map: torch.Tensor,
                              valid_shapes: ValidShapes) -> torch.Tensor:
        """:meth:`global_term` of each image's valid region alone; zero outside it."""
        hw_shape = query_map.shape[-2:]
        outs = []
        for index, (height, width) in enumerate(valid_shapes):
            region = (slice(index, index + 1), slice(None), slice(height), slice(width))
            out = self.global_term(query_map[region], value_map[region])  # (1, h, n, d)
            outs.append(region_tokens_to_grid(out, (height, width), hw_shape))
        return torch.cat(outs)

    def local_term(self, value_map: torch.Tensor) -> torch.Tensor:
        """Per-head depth-wise convolution of V: (B, h * d, H, W) -> same shape."""
        weight = self.local_conv.weight.repeat_interleave(self.head_dims, dim=0)
        return F.conv2d(value_map, weight, padding=self.local_conv.padding,
                        groups=weight.shape[0])

    def forward(self, x: torch.Tensor, hw_shape,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Tokens (B, N, C) on the (H, W) grid ``hw_shape`` -> (B, N, C); with
        ``valid_shapes``, each image attends within its own (h, w) region only
        (the outputs outside it are meaningless)."""
        batch, _, channels = x.shape
        # Q0 and V projected straight into NCHW maps, the convolutions' layout.
        query_map = linear_to_map(x, self.q_proj, hw_shape)  # Q0: (B, C, H, W)
        value_map = linear_to_map(x, self.v_proj, hw_shape)  # V: (B, C, H, W)
        if valid_shapes is None:
            out = self.global_term(query_map, value_map)  # (B, h, N, d)
        else:
            out = self.global_term_per_image(query_map, value_map, valid_shapes)
        local = self.local_term(mask_map(value_map, valid_shapes))  # (B, C, H, W)
        out = merge_heads(out.to(local.dtype)) + local.flatten(2).transpose(1, 2)
        return self.out_proj(out)  # (B, N, C)


def linear_to_map(x: torch.Tensor, layer: nn.Linear, hw_shape) -> torch.Tensor:
    """``layer`` on tokens (B, N, C_in), computed as ``W x^T + b`` into a
    contiguous NCHW map (B, C_out, H, W)."""
    batch, tokens, _ = x.shape
    weight = layer.weight.expand(batch, -1, -1)  # (B, C_out, C_in)
    if layer.bias is None:
        out = torch.bmm(weight, x.transpose(1, 2))  # (B, C_out, N)
    else:
        out = torch.baddbmm(layer.bias[:, None].expand(batch, -1, tokens), weight,
                            x.transpose(1, 2))
    return out.view(batch, -1, *hw_shape)


def map_heads(feature_map: torch.Tensor, num_heads: int) -> torch.Tensor:
    """A map (B, h * d, H, W) as heads of tokens (B, h, H * W, d), a view."""
    batch, channels = feature_map.shape[:2]
    heads = feature_map.reshape(batch, num_heads, channels // num_heads, -1)
    return heads.transpose(-1, -2)


# --- Blocks
class TanhGELU(nn.GELU):
    """GELU with the tanh approximation."""

    def __init__(self):
        super().__init__(approximate='tanh')


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
        x, mlp_out = self.mlp.forward_normed(x, self.norm1)
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
        return x + self.drop_path(self.mlp.forward_normed(x, self.norm2)[1])


def grid_key_mask(x: torch.Tensor, hw_shape, valid_shapes: ValidShapes) -> torch.Tensor:
    """(B, N) bool: True for the leading extra tokens and the valid grid tokens."""
    inside = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)  # (B, H*W)
    extra = x.new_ones(x.shape[0], x.shape[1] - inside.shape[1], dtype=torch.bool)
    return torch.cat((extra, inside), dim=1)


# --- Position embeddings
def interpolate_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                          dst_shape: Tuple[int, int]) -> torch.Tensor:
    """Bilinearly resamples position embeddings (1, Hs * Ws, C) -> (1, H * W, C)."""
    channels = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, *src_shape, channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_shape, mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                     dst_shape: Tuple[int, int]) -> torch.Tensor:
    """``interpolate_pos_embed``, returning ``pos_embed`` itself if unchanged."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    return interpolate_pos_embed(pos_embed, src_shape, dst_shape)


def resize_pos_embed_to_regions(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                                hw_shape: Tuple[int, int],
                                valid_shapes: ValidShapes) -> torch.Tensor:
    """Embeddings (1, Hs * Ws, C) resized per valid region: (B, H * W, C).

    Each image's region gets the embeddings resized to its (h, w); zero outside.
    """
    resized = per_distinct_shape(  # (1, h * w, C) each
        lambda shape: resize_pos_embed(pos_embed, src_shape, shape), valid_shapes)
    return torch.cat([region_tokens_to_grid(resized[shape], shape, hw_shape)
                      for shape in valid_shapes])


# --- Stage
class SoftStage(Exportable, nn.Module):
    """One stage: patch embedding, position embeddings, blocks, and in the last
    stage the class token and the final LayerNorm.

    Tokens ``[cls;] patches + pos`` (B, extra + H * W, C) run the blocks; the
    position embeddings, learned on ``pos_grid``, are resized to each grid.

    Args:
        patch_embed (ConvPatchEmbed): Input map (or image) to tokens.
        blocks (Sequence[nn.Module]): The stage's blocks.
        embed_dims (int): Token width C.
        pos_grid (tuple[int, int]): Grid of the learned position embeddings.
        class_token (bool): Prepend a class token, end with a LayerNorm.
            Default: False.
        drop_rate (float): Dropout after the position embeddings. Default: 0.
    """

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

    def choose_formulation(self, exportable: bool) -> None:
        """ONNX: the resize runs on every grid, the learned one included."""
        self.resize_pos_embed = (interpolate_pos_embed if exportable
                                 else resize_pos_embed)

    def position_embeddings(self, hw_shape: Tuple[int, int],
                            valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """At ``hw_shape`` (per valid region), cls first: (1 or B, extra + H * W, C)."""
        grid_embed = self.pos_embed[:, self.extra_tokens:]
        if valid_shapes is None:
            grid = self.resize_pos_embed(grid_embed, self.pos_grid, hw_shape)
        else:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grid, hw_shape,
                                               valid_shapes)
        if not self.extra_tokens:
            return grid
        extra_embed = self.pos_embed[:, :self.extra_tokens]
        extra_embed = extra_embed.expand(grid.shape[0], -1, -1)
        return torch.cat((extra_embed, grid), dim=1)

    def forward(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int], Optional[ValidShapes]]:
        """Map (B, C_in, H_in, W_in) -> tokens (B, extra + H * W, C), the grid
        (H, W) and its valid regions; padded tokens (``valid_shapes``) are ignored."""
        patches, hw_shape = self.patch_embed(x, valid_shapes)  # (B, N, C)
        if valid_shapes is not None:
            valid_shapes = self.patch_embed.output_shapes(valid_shapes)
        if self.extra_tokens:
            cls_token = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, C)
            patches = torch.cat((cls_token, patches), dim=1)
        tokens = self.pos_drop(  # (B, extra + N, C); no embeddings held by the blocks
            patches + self.position_embeddings(hw_shape, valid_shapes))
        for block in self.blocks:
            tokens = run_block(block, tokens, hw_shape, valid_shapes,
                               checkpointing=self.grad_checkpointing and self.training)
        return self.norm(tokens), hw_shape, valid_shapes


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


class SOFT(DenseBackbone):
    """SOFT / SOFT++ (Lu et al., NeurIPS 2021 / IJCV 2024).

    Four :class:`SoftStage` s at strides 4-32, each a conv patch embedding,
    resized position embeddings and blocks: stages 1-3 run :class:`SoftBlock` s,
    stage 4 :class:`SoftmaxBlock` s with a class token, whose normalised state
    feeds the classifier ``head``.

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

    deprecation_name = 'SOFT'

    @accepts_renamed_arguments
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

        depths = settings['depths']
        drop_path_rates = torch.linspace(0, drop_path_rate, sum(depths),
                                          device='cpu').tolist()
        attn_kwargs = dict(variant=variant, solver=solver,
                           newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        # Patch embeddings first: a seed gives the initial weights it gave
        # before the stage modules.
        patch_embeds = [self._patch_embed(i) for i in range(NUM_STAGES)]
        self.stages = nn.ModuleList()
        for i, dims in enumerate(self.embed_dims):
            rates = drop_path_rates[sum(depths[:i]):sum(depths[:i + 1])]
            blocks = [self._block(i, rate, attn_kwargs) for rate in rates]
            pos_grid = (pretrain_img_size // 2**(i + 2), ) * 2
            self.stages.append(SoftStage(
                patch_embeds[i], blocks, dims, pos_grid,
                class_token=i == CLASS_TOKEN_STAGE, drop_rate=drop_rate))
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

    def _init_from_scratch(self) -> None:
        """Truncated-normal position embeddings, class token and Linear weights."""
        for name, param in self.named_parameters():
            if name.endswith(('.pos_embed', '.cls_token')):
                nn.init.trunc_normal_(param, std=.02)
        self.apply(init_transformer_weights)

    def run_stages(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                   indices: Sequence[int] = (), last_stage: Optional[int] = None
                   ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """Stages 0..``last_stage`` (default: all); padded tokens are ignored.

        Returns:
            tuple[list[Tensor], Tensor]: Maps of ``indices``, (B, C_i, H_i, W_i) at
            stride 2**(i + 2), and the last stage's tokens (B, extra + N, C).
        """
        last_stage = len(self.stages) - 1 if last_stage is None else last_stage
        maps = []
        for i, stage in enumerate(self.stages[:last_stage + 1]):
            tokens, hw_shape, valid_shapes = stage(x, valid_shapes)
            grid = tokens[:, stage.extra_tokens:]  # (B, N, C)
            if i in indices:  # contiguous NCHW, zero outside the valid regions
                maps.append(mask_map(tokens_to_map(grid, hw_shape), valid_shapes))
            x = tokens_as_map(grid, hw_shape)  # the next stage's input, a view
        return maps, tokens

    def forward_maps(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                     indices: Sequence[int]) -> List[torch.Tensor]:
        return self.run_stages(x, valid_shapes, indices, last_stage=max(indices))[0]

    def forward_intermediates(self, x: torch.Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW',
                              intermediates_only: bool = False,
                              valid_shapes: Optional[Sequence] = None):
        """timm's feature API: the maps of ``indices`` (strides 4-32), in one pass.

        Args:
            x: Images (B, in_channels, H, W).
            indices: Stages to return (see ``take_indices``). Default: all.
            norm: Unused (the last stage's map is normalised, as in forward).
            stop_early: Stop after the last stage asked for; with
                ``intermediates_only`` it always does. Default: False.
            output_fmt: ``'NCHW'`` only.
            intermediates_only: Return the maps alone. Default: False.
            valid_shapes: Each image's (h, w) in a padded batch. Default: None.

        Returns:
            The maps, or the last stage's tokens (``forward_features``) and the maps.
        """
        shapes, indices = self.check_intermediates_request(x, indices, output_fmt,
                                                           valid_shapes)
        last_stage = max(indices) if stop_early or intermediates_only else None
        maps, tokens = self.run_stages(x, shapes, indices, last_stage)
        return maps if intermediates_only else (tokens, maps)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised stage-4 tokens, class token first: (B, 1 + N, C)."""
        self.check_input(x)
        return self.run_stages(x, None)[1]

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


# --- Official checkpoints
def checkpoint_filter_fn(state_dict: dict, model: SOFT) -> dict:
    """An official SOFT / SOFT++ checkpoint (fudan-zvg/SOFT) in :class:`SOFT`'s layout.

    A dict in mmsoft's layout (or an earlier one) passes as is; ``head.*`` is kept
    if ``model`` has a classifier.
    """
    mmsoft_keys = {'stages.0.patch_embed.proj.0.weight', 'patch_embeds.0.proj.0.weight'}
    if mmsoft_keys & set(state_dict):  # mmsoft's layout or an earlier one
        return state_dict
    converted, _ = soft_official_to_mmsoft(state_dict, variant=model.variant)
    if isinstance(model.head, nn.Linear):
        converted.update({key: state_dict[key] for key in ('head.weight', 'head.bias')})
    return converted
