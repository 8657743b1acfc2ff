"""UFO-ViT: a vision transformer with softmax-free attention of linear cost.

Song, *UFO-ViT: High Performance Linear Vision Transformer without Softmax*
(arXiv 2109.14382). Attention is ``XNorm(Q) . XNorm(K^T V)``, evaluated right
to left in O(N d^2); the encoder follows XCiT's layout.
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from ..deprecations import accepts_renamed_arguments
from ..utils.torch_compat import autocast_off
from ..utils.validation import (check_divisible, check_mlp_ratio, check_out_indices,
                                check_positive_float, check_positive_int, resolve_arch)
from .functional import (ValidShapes, apply_without_autocast, backward_without_autocast,
                         full_precision, is_recomputing,
                         layer_norm_input_grad, mask_map, merge_heads, pad_to_grid,
                         per_distinct_shape, recomputed, recomputes_locally,
                         scaled_weight_and_bias, split_heads, strided_shapes,
                         valid_mask)
from .layers import (GELU, MLP, ConvPatchEmbed, DenseBackbone, MemoryEfficient,
                     drop_path_or_identity, init_transformer_weights, take_indices,
                     tokens_to_map)


# --- Position encoding
class FourierPositionEncoding(nn.Module):
    """Sinusoids of (y, x) cell coordinates in (0, 2*pi], projected by a 1x1 conv.

    Args:
        embed_dims (int): Output channels.
        hidden_dims (int): Features per coordinate. Default: 32.
        temperature (float): Frequency base. Default: 10000.
    """

    def __init__(self, embed_dims: int, hidden_dims: int = 32,
                 temperature: float = 10000.):
        super().__init__()
        self.hidden_dims = hidden_dims
        self.temperature = temperature
        self.proj = nn.Conv2d(2 * hidden_dims, embed_dims, kernel_size=1)

    def encode_axis(self, length: int, device) -> torch.Tensor:
        """Sinusoidal features of one axis: (length, hidden_dims)."""
        coords = torch.arange(1, length + 1, dtype=torch.float32, device=device)
        coords = coords / (length + 1e-6) * 2 * math.pi  # (length, )
        index = torch.arange(self.hidden_dims, dtype=torch.float32, device=device)
        freqs = self.temperature**(2 * torch.div(index, 2, rounding_mode='floor') /
                                   self.hidden_dims)
        angles = coords[:, None] / freqs  # (length, hidden)
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()),
                           dim=2).flatten(1)

    def forward(self, batch: int, hw_shape: Tuple[int, int], device=None,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Encoding (batch, embed_dims, H, W), per image with ``valid_shapes``."""
        if valid_shapes is None:
            return self.encode_grid(hw_shape, device).expand(batch, -1, -1, -1)
        encodings = per_distinct_shape(  # (1, C, h, w) each
            lambda shape: self.encode_grid(shape, device), valid_shapes)
        return torch.cat([pad_to_grid(encodings[shape], hw_shape)
                          for shape in valid_shapes])

    def encode_grid(self, hw_shape: Tuple[int, int], device=None) -> torch.Tensor:
        """Encoding of one (H, W) grid: (1, embed_dims, H, W)."""
        height, width = hw_shape
        device = device or self.proj.weight.device
        pos_y = self.encode_axis(height, device)[:, None, :].expand(-1, width, -1)
        pos_x = self.encode_axis(width, device)[None, :, :].expand(height, -1, -1)
        pos = torch.cat((pos_y, pos_x), dim=-1).permute(2, 0, 1)  # (2*hidden, H, W)
        pos = pos.to(self.proj.weight.dtype).unsqueeze(0)
        return self.proj(pos)


# --- Local patch interaction
def batch_norm_once(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``; while recomputing (``is_recomputing``), on copies of its
    buffers, so that its running statistics update once per step."""
    if not (norm.training and is_recomputing()):
        return norm(x)
    buffers = {name: buffer.clone() for name, buffer in norm.named_buffers()}
    return functional_call(norm, buffers, (x, ))


class LocalPatchInteraction(MemoryEfficient, nn.Module):
    """Local patch interaction: ``DWConv -> GELU -> BatchNorm -> DWConv`` on the grid.

    Args:
        embed_dims (int): Token width C.
        kernel_size (int): Odd kernel size of both depth-wise convs. Default: 3.
        act_layer (type): Activation class. Default: GELU.

    Raises:
        ValueError: If ``embed_dims`` or ``kernel_size`` is invalid or even.
    """

    def __init__(self, embed_dims: int, kernel_size: int = 3,
                 act_layer: type = GELU):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f'kernel_size={kernel_size} is invalid; expected an '
                             f'odd integer so that the grid keeps its size.')
        padding = kernel_size // 2
        self.conv1 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(embed_dims)
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None,
                layer_scale: Optional[torch.Tensor] = None,
                norm: Optional[nn.LayerNorm] = None) -> torch.Tensor:
        """``layer_scale * conv2(bn(act(conv1(x))))`` on the (H, W) grid: (B, N, C) ->
        (B, N, C); the convs see zeros outside ``valid_shapes``. ``norm``: a
        LayerNorm applied to ``x`` first (the memory-efficient path keeps only
        the normalised x^, ``normalize``)."""
        batch, _, channels = x.shape
        weight2, bias2 = scaled_weight_and_bias(self.conv2, layer_scale)
        recompute = self.saving_memory() and recomputes_locally(self.bn)
        affine = ()
        if norm is not None and recompute:
            x, affine = normalize(x, norm.eps), (norm.weight, norm.bias)
        elif norm is not None:
            x = norm(x)
        # (B, N, C) is a channels-last (B, C, H, W) map: a view, no copy.
        grid = x.transpose(1, 2).view(batch, channels, *hw_shape)
        if recompute:
            grid = recomputed(self.mix, grid, weight2, bias2, valid_shapes, *affine)
        else:
            grid = self.mix(grid, weight2, bias2, valid_shapes)
        return grid.flatten(2).transpose(1, 2)  # (B, N, C)

    def mix(self, grid: torch.Tensor, weight2: torch.Tensor,
            bias2: Optional[torch.Tensor],
            valid_shapes: Optional[ValidShapes] = None,
            norm_weight: Optional[torch.Tensor] = None,
            norm_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``conv2(bn(act(conv1(grid))))``, conv2's weight/bias given: (B, C, H, W);
        ``grid * norm_weight + norm_bias`` (per channel) first where given."""
        if norm_weight is not None:
            grid = torch.addcmul(norm_bias[:, None, None], grid,
                                 norm_weight[:, None, None])
        hidden = self.act(self.conv1(mask_map(grid, valid_shapes)))  # (B, C, H, W)
        hidden = mask_map(batch_norm_once(self.bn, hidden), valid_shapes)
        return F.conv2d(hidden, weight2, bias2, padding=self.conv2.padding,
                        groups=self.conv2.groups)  # (B, C, H, W)


# --- LayerNorm keeping only its normalised output
class Normalize(torch.autograd.Function):
    """Autograd function of ``normalize``."""

    @staticmethod
    def forward(ctx, x, eps):
        normalized, _, rstd = torch.native_layer_norm(  # x^, (..., C); (..., 1)
            x, (x.shape[-1], ), None, None, eps)
        ctx.save_for_backward(normalized, rstd)
        return normalized

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad):
        """``dx = (g - mean(g) - x^ mean(g x^)) / sigma``, ``layer_norm_input_grad``."""
        normalized, rstd = ctx.saved_tensors
        return layer_norm_input_grad(grad, normalized, rstd), None


def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without affine, ``x^ = (x - mean) / sqrt(var + eps)`` over the
    last dimension, keeping its output x^ and 1/sigma for backward instead of x.

    A layer that reads ``norm(x) = gamma x^ + beta`` and keeps its input (a
    Linear with the affine folded in, ``fold_layer_norm``, or a recomputed
    function) then shares x^ with it. Returns float32 under autocast, as LayerNorm.
    """
    return apply_without_autocast(Normalize, x, eps)


def fold_layer_norm(layer: nn.Linear, norm: nn.LayerNorm
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias computing ``layer(norm(x))`` from ``x^``:
    ``W' = W diag(gamma)`` (C_out, C), ``b' = b + W beta`` (C_out,)."""
    with autocast_off(layer.weight.device.type):
        shift = (layer.weight * norm.bias).sum(-1)  # W beta, in full precision
        weight = layer.weight * norm.weight
    return weight, shift if layer.bias is None else layer.bias + shift


# --- UFO attention
def xnorm(x: torch.Tensor, gamma: torch.Tensor, dim: int,
          eps: float = 1e-6) -> torch.Tensor:
    """``XNorm(x) = gamma x / ||x||_2`` along ``dim``, the norm at least ``eps``;
    ``gamma`` broadcasts against ``x``. Returns float32 (float64 for float64)."""
    with autocast_off(x.device.type):
        x = full_precision(x)
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(eps)
        return gamma.to(x.dtype) * (x / norm)


def ufo_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  gamma_q: torch.Tensor, gamma_kv: torch.Tensor,
                  eps: float = 1e-6) -> torch.Tensor:
    """``XNorm(Q) . XNorm(K^T V)`` per head, right to left in O(N d_k d_v).

    Q is normalised per token over its d_k channels (dim -1), K^T V over its d_k
    axis (dim -2), so each of its d_v columns is a unit centroid and outputs are
    cosines bounded by ``|gamma_q gamma_kv|``.

    Args:
        queries (Tensor): Q, shape (B, h, N, d_k).
        keys (Tensor): K, shape (B, h, N, d_k).
        values (Tensor): V, shape (B, h, N, d_v).
        gamma_q (Tensor): XNorm scale of Q per head, shape (h, ).
        gamma_kv (Tensor): XNorm scale of K^T V per head, shape (h, ).
        eps (float): Lower bound of the norms. Default: 1e-6.

    Returns:
        Tensor: Shape (B, h, N, d_v), float32 (float64 for float64 input).
    """
    with autocast_off(queries.device.type):
        queries = full_precision(queries)
        keys = full_precision(keys).to(queries.dtype)
        values = full_precision(values).to(queries.dtype)
        context = keys.transpose(-2, -1) @ values  # (B, h, d_k, d_v)
        context = xnorm(context, gamma_kv.view(-1, 1, 1), dim=-2, eps=eps)
        queries = xnorm(queries, gamma_q.view(-1, 1, 1), dim=-1, eps=eps)
        return queries @ context  # (B, h, N, d_v)


class UFOAttention(MemoryEfficient, nn.Module):
    """UFO self-attention: ``proj(XNorm(Q) . XNorm(K^T V))``, linear in N.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Heads; must divide ``embed_dims``. Default: 8.
        qkv_bias (bool): Bias of the QKV projection. Default: True.
        proj_drop (float): Dropout after the output projection. Default: 0.
        eps (float): Lower bound of the XNorm norms. Default: 1e-6.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int = 8,
                 qkv_bias: bool = True,
                 proj_drop: float = 0.,
                 eps: float = 1e-6):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('num_heads', num_heads)
        check_divisible('embed_dims', [embed_dims], 'num_heads', [num_heads])
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.eps = eps
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.gamma_q = nn.Parameter(torch.ones(num_heads))
        self.gamma_kv = nn.Parameter(torch.ones(num_heads))
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def attend(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
               norm: Optional[nn.LayerNorm] = None) -> torch.Tensor:
        """Attention before ``proj``: (B, N, C) -> (B, h, N, C / h); ``key_mask``
        (B, N) is False for tokens left out of ``K^T V``; ``norm``: a LayerNorm
        applied to ``x`` first (the memory-efficient path folds its affine into
        the QKV projection and keeps only the normalised x^, ``normalize``)."""
        saving_memory = self.saving_memory()
        if norm is not None and saving_memory:
            qkv = F.linear(normalize(x, norm.eps), *fold_layer_norm(self.qkv, norm))
        else:
            qkv = self.qkv(x if norm is None else norm(x))  # (B, N, 3C)
        queries, keys, values = qkv.chunk(3, dim=-1)  # 3 x (B, N, C)
        queries = split_heads(queries, self.num_heads)  # (B, h, N, d)
        keys = split_heads(keys, self.num_heads)  # (B, h, N, d)
        if key_mask is not None:
            keys = keys.masked_fill(~key_mask[:, None, :, None], 0.)
        values = split_heads(values, self.num_heads)  # (B, h, N, d)
        args = (queries, keys, values, self.gamma_q, self.gamma_kv, self.eps)
        if saving_memory:
            out = recomputed(ufo_attention, *args)
        else:
            out = ufo_attention(*args)  # XNorm(Q) . XNorm(K^T V): (B, h, N, d)
        return out.to(values.dtype)

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                layer_scale: Optional[torch.Tensor] = None,
                norm: Optional[nn.LayerNorm] = None) -> torch.Tensor:
        """``layer_scale * proj(attend(x))``, then dropout: (B, N, C) -> (B, N, C);
        ``norm``: a LayerNorm applied to ``x`` first (see ``attend``)."""
        out = merge_heads(self.attend(x, key_mask, norm))  # (B, N, C)
        weight, bias = scaled_weight_and_bias(self.proj, layer_scale)
        return self.proj_drop(F.linear(out, weight, bias))  # (B, N, C)


# --- Block
class UFOBlock(nn.Module):
    """XCiT block with UFO attention: three pre-norm residual branches.

    ``x = x + g1 UFO(LN(x)); x = x + g2 LPI(LN(x)); x = x + g3 MLP(LN(x))``, with
    per-channel LayerScales ``g1..3`` and stochastic depth on every branch.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Attention heads. Default: 8.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        qkv_bias (bool): Bias of the QKV projection. Default: True.
        drop (float): Dropout in the MLP and after attention. Default: 0.
        drop_path (float): Stochastic depth rate. Default: 0.
        layer_scale_init_value (float): Initial ``gamma1..3``. Default: 1e-5.
        local_kernel_size (int): LPI kernel size. Default: 3.
        norm_eps (float): LayerNorm epsilon. Default: 1e-6.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int = 8,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop: float = 0.,
                 drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5,
                 local_kernel_size: int = 3,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = UFOAttention(embed_dims, num_heads, qkv_bias, proj_drop=drop)
        self.gamma1 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.lpi = LocalPatchInteraction(embed_dims, local_kernel_size)
        self.gamma2 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm3 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio), GELU, drop)
        self.gamma3 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Tokens (B, N, C) on an (H, W) grid -> (B, N, C); masks ``valid_shapes``."""
        key_mask = None
        if valid_shapes is not None:
            key_mask = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)  # (B, N)
        x = x + self.drop_path(self.attn(x, key_mask, self.gamma1, norm=self.norm1))
        x = x + self.drop_path(self.lpi(x, hw_shape, valid_shapes, self.gamma2,
                                        norm=self.norm2))
        mlp_out = self.mlp.forward_normed(x, self.norm3, self.gamma3)[1]
        return x + self.drop_path(mlp_out)


# --- Feature pyramid
class FeaturePyramidAdapter(nn.Module):
    """Resamples stride-s maps to strides s/4, s/2, s and 2s, keeping channels.

    Branches: 0 ``ConvT(2, 2) -> BN -> GELU -> ConvT(2, 2)`` (x4), 1 ``ConvT(2, 2)``
    (x2), 2 identity, 3 ``MaxPool2d(2, ceil_mode=True)``; only ``out_indices``.

    Args:
        embed_dims (int): Channels of the maps.
        out_indices (Sequence[int]): Scales (0-3) built. Default: (0, 1, 2, 3).
    """

    def __init__(self, embed_dims: int, out_indices: Sequence[int] = (0, 1, 2, 3)):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        self.out_indices = check_out_indices(out_indices, NUM_STAGES)
        self.branches = nn.ModuleDict(
            {str(i): self._branch(i, embed_dims) for i in self.out_indices})

    @staticmethod
    def _branch(scale: int, dims: int) -> nn.Module:
        if scale == 0:
            return nn.Sequential(
                nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2),
                nn.BatchNorm2d(dims), GELU(),
                nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2))
        if scale == 1:
            return nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2)
        if scale == 2:
            return nn.Identity()
        return nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)

    def forward(self, feats: Sequence[torch.Tensor],
                valid_shapes: Optional[ValidShapes] = None) -> Tuple[torch.Tensor, ...]:
        """One (B, C, H, W) map per ``out_indices`` -> (B, C, 4H, 4W), (B, C, 2H, 2W),
        (B, C, H, W) or (B, C, ceil(H/2), ceil(W/2)) for scale 0-3; zero outside
        ``valid_shapes``. Raises ``ValueError`` if the map count is wrong."""
        if len(feats) != len(self.out_indices):
            raise ValueError(f'got {len(feats)} maps; expected one per out_indices='
                             f'{self.out_indices}.')
        return tuple(self.resample(i, feat, valid_shapes)
                     for i, feat in zip(self.out_indices, feats))

    def resample(self, scale: int, feat: torch.Tensor,
                 valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Branch ``scale`` on one map (B, C, H, W), zero outside ``valid_shapes``."""
        if valid_shapes is None:
            return self.run_branch(scale, feat)
        return self.masked_branch(scale, feat, valid_shapes)

    def masked_branch(self, scale: int, feat: torch.Tensor,
                      valid_shapes: ValidShapes) -> torch.Tensor:
        """Branch ``scale`` ignoring padding; zero outside ``valid_shapes``."""
        if scale == 3:  # the max pool must not pick padded cells
            pooled = self.branches['3'](mask_map(feat, valid_shapes, float('-inf')))
            return mask_map(pooled, strided_shapes(valid_shapes, (2, )))
        factor = 2**(2 - scale)
        out = self.run_branch(scale, feat)  # (B, C, factor * H, factor * W)
        upsampled = [(h * factor, w * factor) for h, w in valid_shapes]
        return mask_map(out, upsampled)

    def run_branch(self, scale: int, feat: torch.Tensor) -> torch.Tensor:
        """Branch ``scale`` on ``feat``."""
        return self.branches[str(scale)](feat)


# --- Architecture settings
ARCH_SETTINGS = {
    'tiny': dict(embed_dims=192, depth=12, num_heads=4),
    'small': dict(embed_dims=304, depth=16, num_heads=8),
    'medium': dict(embed_dims=416, depth=16, num_heads=8),
    'base': dict(embed_dims=512, depth=20, num_heads=8),
}
ARCH_DEFAULTS = dict(mlp_ratio=4., local_kernel_size=3, pos_hidden_dims=32)
CLASS_ATTENTION_LAYERS = 2
NUM_STAGES = 4
PATCH_SIZE = 16
STEM_STRIDES = (2, 2, 2, 2)


# --- Classifier
class ClassAttentionBlock(nn.Module):
    """XCiT's class-attention layer: only the class token queries.

    On ``x = [cls; p]`` with ``n = LN1(x)``: ``c = cls + g1 CA(n)``,
    ``p' = p + g1 n[1:]``, then ``[LN2(c); p'] + [g2 MLP(LN2(c)); p']``: XCiT's
    layer, patch tokens included, as it chains them.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Attention heads.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        qkv_bias (bool): Biases of q, k, v. Default: True.
        drop_path (float): Stochastic depth rate. Default: 0.
        layer_scale_init_value (float): Initial g1, g2. Default: 1e-5.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.gamma1 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio))
        self.gamma2 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[cls; p]`` (B, 1 + N, C) -> (B, 1 + N, C)."""
        normed = self.norm1(x)  # (B, 1 + N, C)
        query = split_heads(self.q(normed[:, :1]), self.num_heads)  # (B, h, 1, d)
        keys, values = (split_heads(t, self.num_heads)
                        for t in self.kv(normed).chunk(2, dim=-1))  # (B, h, 1 + N, d)
        attended = merge_heads(F.scaled_dot_product_attention(query, keys, values))
        update = torch.cat((self.proj(attended), normed[:, 1:]), dim=1)
        x = x + self.drop_path(self.gamma1 * update)
        cls_token = self.norm2(x[:, :1])  # (B, 1, C)
        residual = torch.cat((cls_token, x[:, 1:]), dim=1)
        mlp_out = self.mlp(cls_token, layer_scale=self.gamma2)  # (B, 1, C)
        update = torch.cat((mlp_out, x[:, 1:]), dim=1)
        return residual + self.drop_path(update)


# --- Model
class UFOViT(DenseBackbone):
    """UFO-ViT (Song, arXiv 2109.14382) in XCiT's layout.

    Conv stem (stride 16), Fourier positions, ``depth`` :class:`UFOBlock` s; output
    ``k`` follows block ``(k + 1) * depth // 4 - 1``, at stride 4 * 2**k (multi_scale).

    Args:
        arch (str | dict): A key of ``ARCH_SETTINGS`` or a dict with ``embed_dims``,
            ``depth``, ``num_heads`` and keys of ``ARCH_DEFAULTS``.
            Default: ``'small'``.
        in_channels (int): Image channels. Default: 3.
        out_indices (Sequence[int]): Outputs (0-3) built. Default: (0, 1, 2, 3).
        qkv_bias (bool): Bias of the QKV projections. Default: True.
        drop_rate (float): Dropout rate. Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly. Default: 0.1.
        layer_scale_init_value (float): Initial LayerScales. Default: 1e-5.
        memory_efficient (bool): Use the memory-efficient path. Default: True.
        recompute_mlp (bool): MLPs also recompute their hidden layer. Default: False.
        multi_scale (bool): Build the feature pyramid. Default: True.
        num_classes (int): Classifier outputs (0: none). Default: 0.
        global_pool (str): ``'token'`` (class attention) or ``''``. Default: ``''``.

    Deprecated spellings: ``recompute_ffn=`` (``recompute_mlp=``),
    ``arch['lpi_kernel_size']`` (``arch['local_kernel_size']``).
    """

    deprecation_name = 'UFOViT'

    @accepts_renamed_arguments
    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 layer_scale_init_value: float = 1e-5,
                 memory_efficient: bool = True,
                 recompute_mlp: bool = False,
                 multi_scale: bool = True,
                 num_classes: int = 0,
                 global_pool: str = ''):
        super().__init__(in_channels, out_indices, num_classes, global_pool, drop_rate,
                         drop_path_rate)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'depth', 'num_heads'), ARCH_DEFAULTS)
        self._check_arch(settings)
        check_positive_float('layer_scale_init_value', layer_scale_init_value)
        self.arch_settings = settings
        self.embed_dims = dims = settings['embed_dims']
        self.depth = depth = settings['depth']
        self.stage_ends = [(k + 1) * depth // NUM_STAGES for k in range(NUM_STAGES)]
        self.num_features = self.head_hidden_size = dims
        self.feature_info = [
            dict(num_chs=dims, reduction=2**(k + 2) if multi_scale else PATCH_SIZE,
                 module=f'blocks.{end - 1}') for k, end in enumerate(self.stage_ends)]

        self.patch_embed = ConvPatchEmbed(
            [in_channels, dims // 8, dims // 4, dims // 2, dims], STEM_STRIDES,
            act_layer=GELU, last_act=False)
        self.pos_embed = FourierPositionEncoding(dims, settings['pos_hidden_dims'])
        self.pos_drop = nn.Dropout(drop_rate)
        drop_path_rates = torch.linspace(0, drop_path_rate, depth,
                                         device='cpu').tolist()
        self.blocks = nn.ModuleList(
            UFOBlock(dims, settings['num_heads'], settings['mlp_ratio'], qkv_bias,
                     drop_rate, rate, layer_scale_init_value,
                     settings['local_kernel_size']) for rate in drop_path_rates)
        self.pyramid = (FeaturePyramidAdapter(dims, self.out_indices) if multi_scale
                        else None)
        if global_pool == 'token':
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dims))
            self.cls_attn_blocks = nn.ModuleList(
                ClassAttentionBlock(dims, settings['num_heads'], settings['mlp_ratio'],
                                    qkv_bias,
                                    layer_scale_init_value=layer_scale_init_value)
                for _ in range(CLASS_ATTENTION_LAYERS))
            self.norm = nn.LayerNorm(dims, eps=1e-6)
        self.head = self._classifier(num_classes)
        self.select_memory_path(memory_efficient, recompute_mlp)
        self._init_from_scratch()

    @staticmethod
    def _check_arch(settings: dict) -> None:
        """Raises ``ValueError`` for an invalid architecture setting."""
        for key in ('embed_dims', 'depth', 'num_heads', 'local_kernel_size',
                    'pos_hidden_dims'):
            check_positive_int(f'arch[{key!r}]', settings[key])
        dims = settings['embed_dims']
        if dims % 8 != 0:
            raise ValueError(f"arch['embed_dims']={dims} is invalid; expected a "
                             f'multiple of 8 (the patch embedding widths are '
                             f'embed_dims/8, /4 and /2).')
        if settings['depth'] < NUM_STAGES:
            raise ValueError(f"arch['depth']={settings['depth']} is invalid; "
                             f'expected at least {NUM_STAGES} blocks, one per '
                             f'output.')
        check_divisible("arch['embed_dims']", [dims], "arch['num_heads']",
                        [settings['num_heads']])
        check_mlp_ratio("arch['mlp_ratio']", settings['mlp_ratio'], dims)

    def _init_from_scratch(self) -> None:
        """Truncated-normal Linear weights and class token."""
        self.apply(init_transformer_weights)
        if self.global_pool == 'token':
            nn.init.trunc_normal_(self.cls_token, std=.02)

    def run_blocks(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                   indices: Sequence[int] = (), last_block: Optional[int] = None
                   ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """Stem and blocks up to ``last_block`` (default: all): the maps of
        ``indices`` (B, C, H_k, W_k), stride 4 * 2**k with ``multi_scale``, else 16,
        and the last tokens (B, N, C). Raises ``ValueError`` for an output
        without a pyramid branch."""
        missing = [i for i in indices if self.pyramid is not None
                   and i not in self.pyramid.out_indices]
        if missing:
            raise ValueError(f'outputs {missing} have no pyramid branch; build the '
                             f'model with out_indices including them (it has '
                             f'{self.out_indices}).')
        batch = x.shape[0]
        x, hw_shape = self.patch_embed(x, valid_shapes)  # (B, N, C), N = h * w
        if valid_shapes is not None:
            valid_shapes = self.patch_embed.output_shapes(valid_shapes)
        pos = self.pos_embed(batch, hw_shape, x.device, valid_shapes)  # (B, C, h, w)
        x = self.pos_drop(x + pos.flatten(2).transpose(1, 2).to(x.dtype))
        read_after = {self.stage_ends[i] - 1: i for i in indices}
        last_block = len(self.blocks) - 1 if last_block is None else last_block
        maps = []
        for i, block in enumerate(self.blocks[:last_block + 1]):
            x = self.run_block(block, x, hw_shape, valid_shapes)  # (B, N, C)
            if i in read_after:
                feat = tokens_to_map(x, hw_shape)  # (B, C, h, w)
                maps.append(mask_map(feat, valid_shapes) if self.pyramid is None else
                            self.pyramid.resample(read_after[i], feat, valid_shapes))
        return maps, x

    def forward_maps(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                     indices: Sequence[int]) -> List[torch.Tensor]:
        return self.run_blocks(x, valid_shapes, indices,
                               self.stage_ends[max(indices)] - 1)[0]

    def forward_intermediates(self, x: torch.Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW',
                              intermediates_only: bool = False,
                              valid_shapes: Optional[Sequence] = None):
        """timm's feature API: the maps of ``indices``, in one pass; arguments
        and returns as :meth:`mmsoft.models.soft.SOFT.forward_intermediates`."""
        shapes, indices = self.check_intermediates_request(x, indices, output_fmt,
                                                           valid_shapes)
        last_block = (self.stage_ends[max(indices)] - 1
                      if stop_early or intermediates_only else None)
        maps, tokens = self.run_blocks(x, shapes, indices, last_block)
        return maps if intermediates_only else (self.class_attention(tokens), maps)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``[cls; patches]`` (B, 1 + N, C), or tokens (B, N, C)."""
        self.check_input(x)
        return self.class_attention(self.run_blocks(x, None)[1])

    def class_attention(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, C) -> normalised ``[cls; patches]`` (B, 1 + N, C) through
        the class-attention blocks (``global_pool='token'``), else as they are."""
        if self.global_pool != 'token':
            return tokens
        x = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        for block in self.cls_attn_blocks:
            x = block(x)  # (B, 1 + N, C)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits (B, num_classes), or features (B, C) with ``pre_logits``."""
        x = x[:, 0] if self.global_pool == 'token' else x.mean(1)
        return x if pre_logits else self.head(x)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new classifier of ``num_classes`` outputs (0: none)."""
        if global_pool not in (None, self.global_pool):
            raise ValueError(f'global_pool={global_pool!r} cannot be changed on a '
                             f'built model (it is {self.global_pool!r}).')
        self.num_classes = num_classes
        self.head = self._classifier(num_classes)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drops the blocks after the last output of ``indices`` and
        (``prune_head``) the classifier parts; returns the kept indices."""
        kept = take_indices(indices, len(self.feature_info))
        del self.blocks[self.stage_ends[max(kept)]:]
        self.feature_info = self.feature_info[:max(kept) + 1]
        if prune_head and self.global_pool == 'token':
            del self.cls_token, self.cls_attn_blocks, self.norm
            self.global_pool = ''
        if prune_head:
            self.reset_classifier(0)
        return kept

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {'cls_token'}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r'^cls_token|^patch_embed|^pos_embed',
                    blocks=r'^blocks\.(\d+)',
                    cls_attn_blocks=[(r'^cls_attn_blocks\.(\d+)', None),
                                     (r'^norm', (99999, ))])
