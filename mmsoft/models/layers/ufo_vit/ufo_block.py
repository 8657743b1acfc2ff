"""The pre-norm UFO-ViT block: UFO attention, local patch interaction, MLP."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath

from ...ops.valid_region import ValidShapes, valid_mask
from ..shared.gelu import GELU
from ..shared.mlp import MLP
from .local_patch_interaction import LocalPatchInteraction
from .ufo_attention import UFOAttention


class UFOBlock(nn.Module):
    """Three pre-norm residual branches with per-channel scales.

    ``x = x + g1 * UFO(LN(x))``; ``x = x + g2 * LPI(LN(x))``;
    ``x = x + g3 * MLP(LN(x))``, each branch also under stochastic depth.
    ``g1``, ``g2``, ``g3`` (``gamma1..3``, the LayerScales) are learnable,
    one value per channel, all initialised to ``layer_scale_init_value``.
    Each branch folds its scale into its last layer's weight and bias
    (``layer_scale=`` of :class:`UFOAttention`, :class:`LocalPatchInteraction`
    and :class:`~mmsoft.models.layers.shared.mlp.MLP`), so that no branch
    output is kept for the scale's gradient.

    The block is XCiT's ``XCABlock`` with UFO attention in place of XCA;
    parameter names and their XCiT counterparts are listed in
    ``docs/ufo_vit_design.md``.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of attention heads. Default: 8.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        qkv_bias (bool): Whether the QKV projection has a bias. Default: True.
        drop (float): Dropout in the MLP and after the attention projection.
            Default: 0.
        drop_path (float): Stochastic depth rate of all three branches.
            Default: 0.
        layer_scale_init_value (float): Initial value of ``gamma1..3``.
            Default: 1e-5.
        local_kernel_size (int): Kernel of the local patch interaction.
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
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, N, C) on an (H, W) grid -> (B, N, C).

        Args:
            x (Tensor): Tokens, shape (B, N, C), H * W = N.
            hw_shape (tuple[int, int]): The token grid (H, W).
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid. Given, padded tokens are left out
                of the attention's ``K^T V`` and the local patch interaction
                sees zeros outside the regions. Default: None.

        Returns:
            Tensor: Shape (B, N, C).
        """
        key_mask = None
        if valid_shapes is not None:
            key_mask = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)  # (B, N)
        x = x + self.drop_path(self.attn(self.norm1(x), key_mask,
                                         layer_scale=self.gamma1))
        x = x + self.drop_path(self.lpi(self.norm2(x), hw_shape, valid_shapes,
                                        layer_scale=self.gamma2))
        return x + self.drop_path(self.mlp(self.norm3(x), layer_scale=self.gamma3))
