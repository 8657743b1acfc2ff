"""The post-norm transformer block of SOFT stages 1-3."""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath

from ..shared.mlp import MLP, TanhGELU
from ...ops.valid_region import ValidShapes
from .soft_attention import SoftAttention


class SoftBlock(nn.Module):
    """``x = LN(x + attn(x)); x = LN(x + MLP(x))`` with SOFT attention.

    The MLP is 4x wide with tanh-approximated GELU, as in the reference
    model. Stochastic depth (``drop_path``) replaces the reference's
    element-wise dropout on the residual branches; both are the identity at
    inference.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads.
        sr_ratio (int): Stride of the bottleneck convolution.
        local_kernel_size (int): Kernel of the depth-wise convolution on V.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        drop_path (float): Stochastic depth rate. Default: 0.
        **attn_kwargs: ``variant``, ``solver``, ``newton_iters``,
            ``max_bottleneck_tokens`` and ``kernel_chunk_tokens`` of
            :class:`SoftAttention`.
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
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw_shape,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, N, C) on an (H, W) grid -> (B, N, C).

        ``valid_shapes``: each image's valid region of the grid, or None
        (see :meth:`SoftAttention.forward`).
        """
        x = self.norm1(x + self.drop_path(self.attn(x, hw_shape, valid_shapes)))
        return self.norm2(x + self.drop_path(self.mlp(x)))
