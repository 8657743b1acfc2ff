"""The pre-norm UFO-ViT block: UFO attention, local patch interaction, FFN."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath

from ...memory_efficient.layer_scale import ufo_block_with_folded_scales
from ...memory_efficient.switch import MemoryEfficient
from ...tracing import is_tracing
from ..shared.gelu import GELU
from ..shared.mlp import MLP
from ...ops.valid_region import ValidShapes, valid_mask
from .local_patch_interaction import LocalPatchInteraction
from .ufo_attention import UFOAttention


class UFOBlock(MemoryEfficient, nn.Module):
    """Three pre-norm residual branches with per-channel scales.

    ``x = x + g1 * UFO(LN(x))``; ``x = x + g2 * LPI(LN(x))``;
    ``x = x + g3 * FFN(LN(x))``, each branch also under stochastic depth.
    ``g1``, ``g2``, ``g3`` (``gamma1..3``) are learnable, one value per
    channel, all initialised to ``layer_scale_init_value``. The small default
    (1e-5, the value CaiT and XCiT use for deep models) makes each freshly
    initialised block nearly the identity, which keeps deep stacks stable at
    the start of training; the scales grow as the branches become useful.

    Apart from the attention (:class:`UFOAttention` instead of XCA), this is
    XCiT's ``XCABlock`` (timm ``xcit.py``) as XCiT's model builds it
    (LayerNorm eps 1e-6, branches attention, LPI, FFN): with UFO attention
    swapped into XCiT's block, both give the same output. XCiT's names
    follow its original code, not the branch order; the mapping from XCiT is
    ``norm2 <- norm3``, ``lpi <- local_mp``, ``gamma2 <- gamma3``,
    ``norm3 <- norm2``, ``ffn <- mlp``, ``gamma3 <- gamma2`` (the rest keeps
    its name). ``valid_shapes`` (padding out of ``K^T V`` and the LPI) is
    not in XCiT. See ``tests/test_ufo_vit_vs_xcit.py``.

    Memory-efficient path (the switch :attr:`memory_efficient`, in
    training and inference alike, so that both compute the same; not while
    a tracer records, :func:`~mmsoft.models.tracing.is_tracing`): each gamma
    is folded into its branch's last layer, so that no branch output is kept
    for gamma's gradient
    (:func:`~mmsoft.models.memory_efficient.layer_scale.ufo_block_with_folded_scales`).

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of attention heads. Default: 8.
        mlp_ratio (float): FFN hidden width / C. Default: 4.
        qkv_bias (bool): Whether the QKV projection has a bias. Default: True.
        drop (float): Dropout in the FFN and after the attention projection.
            Default: 0.
        drop_path (float): Stochastic depth rate of all three branches.
            Default: 0.
        layer_scale_init_value (float): Initial value of ``gamma1..3``.
            Default: 1e-5.
        lpi_kernel_size (int): Kernel of the local patch interaction.
            Default: 3.
        norm_eps (float): Epsilon of the LayerNorms. Default: 1e-6.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int = 8,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop: float = 0.,
                 drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5,
                 lpi_kernel_size: int = 3,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = UFOAttention(embed_dims, num_heads, qkv_bias, proj_drop=drop)
        self.gamma1 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.lpi = LocalPatchInteraction(embed_dims, lpi_kernel_size)
        self.gamma2 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm3 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.ffn = MLP(embed_dims, int(embed_dims * mlp_ratio), GELU, drop)
        self.gamma3 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, N, C) on an (H, W) grid -> (B, N, C).

        ``valid_shapes``: each image's valid region of the grid, or None.
        Given, padded tokens are left out of the attention's ``K^T V`` and the
        local patch interaction sees zeros outside the regions.
        """
        key_mask = None
        if valid_shapes is not None:
            key_mask = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)
        if self.memory_efficient and not is_tracing():
            return ufo_block_with_folded_scales(self, x, hw_shape, valid_shapes,
                                                key_mask)
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x), key_mask))
        x = x + self.drop_path(self.gamma2 * self.lpi(self.norm2(x), hw_shape,
                                                      valid_shapes))
        return x + self.drop_path(self.gamma3 * self.ffn(self.norm3(x)))
