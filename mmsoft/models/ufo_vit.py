"""UFO-ViT: a vision transformer whose softmax-free attention costs O(N).

Song, *UFO-ViT: High Performance Linear Vision Transformer without Softmax*
(arXiv 2109.14382). Attention is ``XNorm(Q) . XNorm(K^T V)``, evaluated right
to left in O(N d^2); the encoder follows XCiT's layout, and a pyramid
resamples four of its blocks' outputs to strides 4-32 (docs/ufo_vit_design.md).
"""
import math
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..utils.validation import (check_divisible, check_mlp_ratio, check_out_indices,
                                check_positive_float, check_positive_int, resolve_arch)
from ..ops.layer_norm import layer_norm_linear, layer_norm_mlp, scaled_linear
from ..ops.xnorm import xnorm_attention
from .common import (GELU, MLP, ConvPatchEmbed, DenseBackbone, DropPath, Regions,
                     ValidShapes, batch_norm_once, drop_path_or_identity,
                     init_transformer_weights, is_tracing, mask_map, merge_heads,
                     pad_to_grid, recomputed, recomputes_locally, regions_on_grid,
                     split_heads, take_indices, tokens_to_map)


# --- Position encoding
class FourierPositionEncoding(nn.Module):
    """Sinusoids of (y, x) cell coordinates in (0, 2 pi], ``hidden_dims`` per
    coordinate, projected by a 1x1 convolution to ``embed_dims``."""

    def __init__(self, embed_dims: int, hidden_dims: int = 32,
                 temperature: float = 10000.):
        super().__init__()
        self.hidden_dims = hidden_dims
        self.temperature = temperature
        self.proj = nn.Conv2d(2 * hidden_dims, embed_dims, kernel_size=1)

    def forward(self, batch: int, hw_shape: Tuple[int, int],
                regions: Optional[Regions] = None) -> torch.Tensor:
        """The encoding (batch, embed_dims, H, W); per region with ``regions``,
        zero outside them."""
        if regions is None:
            sinusoids = self.sinusoids(hw_shape)[None]  # (1, 2 hidden, H, W)
        else:
            sinusoids = torch.stack([pad_to_grid(self.sinusoids(shape), hw_shape)
                                     for shape in regions.shapes])
        # Made on the CPU, copied to the device without waiting for it.
        weight = self.proj.weight
        sinusoids = sinusoids.to(weight.device, weight.dtype, non_blocking=True)
        encoding = mask_map(self.proj(sinusoids), regions)  # (B or 1, C, H, W)
        return encoding.expand(batch, -1, -1, -1)

    def encode_axis(self, length: int) -> torch.Tensor:
        """Sinusoidal features of one axis: (length, hidden_dims), on the CPU."""
        coords = torch.arange(1, length + 1, dtype=torch.float32)
        coords = coords / (length + 1e-6) * 2 * math.pi
        index = torch.arange(self.hidden_dims, dtype=torch.float32)
        freqs = self.temperature**(2 * torch.div(index, 2, rounding_mode='floor')
                                   / self.hidden_dims)
        angles = coords[:, None] / freqs  # (length, hidden)
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), 2).flatten(1)

    def sinusoids(self, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The features of one (H, W) grid, (2 hidden, H, W) on the CPU: y's, then
        x's."""
        height, width = hw_shape
        pos_y = self.encode_axis(height)[:, None, :].expand(-1, width, -1)
        pos_x = self.encode_axis(width)[None, :, :].expand(height, -1, -1)
        return torch.cat((pos_y, pos_x), dim=-1).permute(2, 0, 1)


# --- Local patch interaction
class LocalPatchInteraction(nn.Module):
    """``DWConv -> GELU -> BatchNorm -> DWConv`` on the grid of tokens; an odd
    ``kernel_size`` keeps the grid's size."""

    def __init__(self, embed_dims: int, kernel_size: int = 3, act_layer: type = GELU):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f'kernel_size={kernel_size} is invalid; expected an '
                             f'odd integer so that the grid keeps its size.')
        padding = kernel_size // 2

        self.conv1 = nn.Conv2d(embed_dims, embed_dims, kernel_size, padding=padding,
                               groups=embed_dims)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(embed_dims)
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, kernel_size, padding=padding,
                               groups=embed_dims)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Tokens (B, N, C) on the (H, W) grid -> (B, N, C); the convolutions see
        zeros where ``padding`` (B, 1, H, W) is True."""
        batch, _, channels = x.shape
        grid = x.transpose(1, 2).view(batch, channels, *hw_shape)  # a view
        if padding is not None:
            grid = grid.masked_fill(padding, 0.)
        hidden = batch_norm_once(self.bn, self.act(self.conv1(grid)))
        if padding is not None:
            hidden = hidden.masked_fill(padding, 0.)
        return self.conv2(hidden).flatten(2).transpose(1, 2)


# --- Attention
class UFOAttention(nn.Module):
    """UFO self-attention: ``proj(XNorm(Q) . XNorm(K^T V))``, linear in N
    (:func:`~mmsoft.ops.xnorm.xnorm_attention`)."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int = 8, qkv_bias: bool = True,
                 proj_drop: float = 0., eps: float = 1e-6):
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

    def forward(self, x: torch.Tensor,
                key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, N, C) -> (B, N, C); tokens where ``key_mask`` (B, N) is False are
        left out of ``K^T V``."""
        return self.proj_drop(self.proj(self.attend(self.qkv(x), key_mask)))

    def attend(self, qkv: torch.Tensor,
               key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``XNorm(Q) . XNorm(K^T V)`` of the projections (B, N, 3C): (B, N, C), in
        their dtype."""
        out = xnorm_attention(qkv, self.num_heads, self.gamma_q, self.gamma_kv,
                              key_mask, self.eps, fused=self.memory_efficient)
        return out.to(qkv.dtype)


# --- Block
class UFOBlock(nn.Module):
    """XCiT's block with UFO attention: ``x + g1 UFO(LN(x))``, ``x + g2 LPI(LN(x))``,
    ``x + g3 MLP(LN(x))``, per-channel layer scales g1..3, stochastic depth."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int = 8, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, drop: float = 0., drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5, local_kernel_size: int = 3,
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
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                regions: Optional[Regions] = None,
                drop_masks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Tokens (B, N, C) on the (H, W) grid -> (B, N, C); ``drop_masks`` (3, B):
        the branches' stochastic-depth masks.

        Where ``memory_efficient``, each LayerNorm runs as one op with the layer
        that reads it and each layer scale with its branch's last layer
        (:mod:`mmsoft.ops.layer_norm`: they keep the LayerNorm's input
        alone), and the local patch interaction is recomputed in backward."""
        fused = self.memory_efficient
        masks = (None, ) * 3 if drop_masks is None else drop_masks
        padding = None if regions is None else regions.padding  # (B, 1, H, W)
        key_mask = None if regions is None else regions.inside  # (B, N)
        # x + drop_path(g1 UFO(LN1(x))), as drop_path.add_to(x, ...) throughout
        qkv = layer_norm_linear(x, self.norm1, self.attn.qkv, fused)  # (B, N, 3C)
        attended = self.attn.attend(qkv, key_mask)
        attended = scaled_linear(attended, self.attn.proj, self.gamma1, fused)
        x = self.drop_path.add_to(x, self.attn.proj_drop(attended), masks[0])
        # x + drop_path(g2 LPI(LN2(x)))
        if fused and x.requires_grad and not is_tracing() \
                and recomputes_locally(self.lpi.bn):  # a SyncBatchNorm is not rerun
            local = recomputed(self.local_branch, x, hw_shape, padding)
        else:
            local = self.local_branch(x, hw_shape, padding)
        x = self.drop_path.add_to(x, local, masks[1])
        # x + drop_path(g3 MLP(LN3(x)))
        mlp_out = layer_norm_mlp(x, self.norm3, self.mlp, self.gamma3, fused)[1]
        return self.drop_path.add_to(x, mlp_out, masks[2])

    def local_branch(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                     padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``g2 LPI(LN2(x))``: (B, N, C) -> (B, N, C)."""
        return self.gamma2 * self.lpi(self.norm2(x), hw_shape, padding)


# --- Feature pyramid
class FeaturePyramidAdapter(nn.Module):
    """Resamples stride-s maps to strides s/4, s/2, s and 2s: ``ConvT -> BN ->
    GELU -> ConvT`` (x4), ``ConvT`` (x2), the identity, ``MaxPool2d(2,
    ceil_mode=True)``, the branches of ``out_indices``."""

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
                regions: Optional[Regions] = None) -> Tuple[torch.Tensor, ...]:
        """One (B, C, H, W) map per ``out_indices`` -> (B, C, 4H, 4W), (B, C, 2H, 2W),
        (B, C, H, W) or (B, C, ceil(H/2), ceil(W/2)) for scale 0-3.

        Raises:
            ValueError: A map count other than one per ``out_indices``.
        """
        if len(feats) != len(self.out_indices):
            raise ValueError(f'got {len(feats)} maps; expected one per out_indices='
                             f'{self.out_indices}.')
        return tuple(self.resample(i, feat, regions)
                     for i, feat in zip(self.out_indices, feats))

    def resample(self, scale: int, feat: torch.Tensor,
                 regions: Optional[Regions] = None) -> torch.Tensor:
        """Branch ``scale`` on one map (B, C, H, W), zero outside the map's
        ``regions`` (resampled with it)."""
        branch = self.branches[str(scale)]
        if regions is None:
            return branch(feat)

        if scale == 3:  # the max pool must not pick padded cells
            pooled = branch(mask_map(feat, regions, float('-inf')))
            return mask_map(pooled, regions.strided(2))
        return mask_map(branch(feat), regions.upsampled(2**(2 - scale)))


# --- Classifier
class ClassAttentionBlock(nn.Module):
    """XCiT's class-attention layer: only the class token queries.

    On ``x = [cls; p]``, ``n = LN1(x)``: ``c = cls + g1 CA(n)``, ``p' = p + g1
    n[1:]``, then ``[LN2(c); p'] + [g2 MLP(LN2(c)); p']``: XCiT's layer with
    the patch tokens as it chains them."""

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
        normed = self.norm1(x)
        query = split_heads(self.q(normed[:, :1]), self.num_heads)  # (B, h, 1, d)
        keys, values = (split_heads(t, self.num_heads)
                        for t in self.kv(normed).chunk(2, dim=-1))  # (B, h, 1 + N, d)
        attended = merge_heads(F.scaled_dot_product_attention(query, keys, values))
        update = torch.cat((self.proj(attended), normed[:, 1:]), dim=1)
        x = x + self.drop_path(self.gamma1 * update)

        cls_token = self.norm2(x[:, :1])  # (B, 1, C)
        update = torch.cat((self.gamma2 * self.mlp(cls_token), x[:, 1:]), dim=1)
        return torch.cat((cls_token, x[:, 1:]), dim=1) + self.drop_path(update)


# --- Model
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


class UFOViT(DenseBackbone):
    """UFO-ViT (Song, arXiv 2109.14382) in XCiT's layout.

    A convolutional stem (stride 16), Fourier positions and ``depth``
    :class:`UFOBlock` s; output k follows block ``(k + 1) * depth // 4 - 1``, at
    stride ``4 * 2**k`` (``multi_scale``) or 16.

    Args:
        arch (str | dict): A key of ``ARCH_SETTINGS``, or a dict of ``embed_dims``,
            ``depth``, ``num_heads`` (and ``ARCH_DEFAULTS``' keys).
        memory_efficient (bool): Train through the ops' training implementations,
            which keep less for backward (False: plain autograd throughout).
        recompute_mlp (bool): The MLPs recompute their hidden layer too.
        multi_scale (bool): Build the feature pyramid.
        global_pool (str): ``'token'`` (class attention) or ``''``."""

    family = 'UFOViT'

    def __init__(self, arch: Union[str, dict] = 'small', in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3), qkv_bias: bool = True,
                 drop_rate: float = 0., drop_path_rate: float = 0.1,
                 layer_scale_init_value: float = 1e-5, memory_efficient: bool = True,
                 recompute_mlp: bool = False, multi_scale: bool = True,
                 num_classes: int = 0, global_pool: str = ''):
        super().__init__(in_channels, out_indices, num_classes, global_pool, drop_rate,
                         drop_path_rate)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'depth', 'num_heads'),
                                ARCH_DEFAULTS)
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
        rates = torch.linspace(0, drop_path_rate, depth, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            UFOBlock(dims, settings['num_heads'], settings['mlp_ratio'], qkv_bias,
                     drop_rate, rate, layer_scale_init_value,
                     settings['local_kernel_size']) for rate in rates)
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
        self.register_drop_paths(rates, branches=3)
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
                             f'expected at least {NUM_STAGES} blocks, one per output.')
        check_divisible("arch['embed_dims']", [dims], "arch['num_heads']",
                        [settings['num_heads']])
        check_mlp_ratio("arch['mlp_ratio']", settings['mlp_ratio'], dims)

    def _init_from_scratch(self) -> None:
        """Truncated-normal Linear weights and class token."""
        self.apply(init_transformer_weights)
        if self.global_pool == 'token':
            nn.init.trunc_normal_(self.cls_token, std=.02)

    def embed(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes] = None):
        """Images -> tokens (B, N, C) with their positions, the (H, W) grid and
        the regions on it."""
        regions = regions_on_grid(valid_shapes, x.shape[-2:], x.device)
        tokens, hw_shape, regions = self.patch_embed(x, regions)  # (B, N, C)
        pos = self.pos_embed(x.shape[0], hw_shape, regions)  # (B, C, H, W)
        tokens = self.pos_drop(tokens + pos.flatten(2).transpose(1, 2).to(tokens.dtype))
        return tokens, hw_shape, regions

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``[cls; patches]`` (B, 1 + N, C), or the tokens (B, N, C)."""
        self.check_input(x)
        x, hw_shape, _ = self.embed(x)
        x = self.run_blocks(self.blocks, x, hw_shape)
        return self.class_attention(x)

    def run_blocks(self, blocks, x: torch.Tensor, hw_shape: Tuple[int, int],
                   regions: Optional[Regions] = None, after: Optional[Callable] = None):
        """Tokens (B, N, C) through ``blocks``, each with its stochastic-depth
        masks, recomputed in backward where gradient checkpointing is on;
        ``after(i, x)`` sees block i's output."""
        drop_masks = self.drop_path_masks(x.shape[0])
        for i, block in enumerate(blocks):
            masks = None if drop_masks is None else drop_masks[i]
            if self.grad_checkpointing and self.training and x.requires_grad:
                x = recomputed(block, x, hw_shape, regions, masks)  # (B, N, C)
            else:
                x = block(x, hw_shape, regions, masks)
            if after is not None:
                after(i, x)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits (B, num_classes), or features (B, C) with ``pre_logits``."""
        x = x[:, 0] if self.global_pool == 'token' else x.mean(1)
        return x if pre_logits else self.head(x)

    def forward_intermediates(self, x: torch.Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW',
                              intermediates_only: bool = False,
                              valid_shapes: Optional[Sequence] = None):
        """timm's feature API, as :meth:`mmsoft.models.soft.SOFT.forward_intermediates`;
        a ``ValueError`` for an output without a pyramid branch."""
        valid_shapes, indices = self.intermediates_request(x, indices, output_fmt,
                                                           valid_shapes)
        missing = [i for i in indices
                   if self.pyramid is not None and i not in self.pyramid.out_indices]
        if missing:
            raise ValueError(f'outputs {missing} have no pyramid branch; build the '
                             f'model with out_indices including them (it has '
                             f'{self.out_indices}).')
        read_after = {self.stage_ends[i] - 1: i for i in indices}
        last = max(read_after) if stop_early or intermediates_only else self.depth - 1

        x, hw_shape, regions = self.embed(x, valid_shapes)
        maps = []

        def read(i: int, tokens: torch.Tensor) -> None:
            if i in read_after:
                feat = tokens_to_map(tokens, hw_shape)  # (B, C, H, W)
                maps.append(mask_map(feat, regions) if self.pyramid is None
                            else self.pyramid.resample(read_after[i], feat, regions))

        x = self.run_blocks(self.blocks[:last + 1], x, hw_shape, regions, read)
        return maps if intermediates_only else (self.class_attention(x), maps)

    def class_attention(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, C) -> normalised ``[cls; patches]`` (B, 1 + N, C) through the
        class-attention blocks (``global_pool='token'``), else as they are."""
        if self.global_pool != 'token':
            return tokens
        x = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        for block in self.cls_attn_blocks:
            x = block(x)  # (B, 1 + N, C)
        return self.norm(x)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new classifier of ``num_classes`` outputs (0: none).

        Raises:
            ValueError: A ``global_pool`` other than the model's.
        """
        if global_pool not in (None, self.global_pool):
            raise ValueError(f'global_pool={global_pool!r} cannot be changed on a '
                             f'built model (it is {self.global_pool!r}).')
        self.num_classes = num_classes
        self.head = self._classifier(num_classes)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drops the blocks after the last output of ``indices`` and
        (``prune_head``) the classifier; returns the kept indices."""
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
