"""CaiT's class attention: the class token attends to itself and the patch tokens."""
import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath

from ..models.layers import MLP
from ..models.layers.shared import GlobalSoftmaxAttention


class ClassAttentionBlock(nn.Module):
    """CaiT's class-attention block with per-channel residual scales.

    ``cls = cls + g1 * CA(LN([cls; x]))``; ``cls = cls + g2 * FFN(LN(cls))``.
    The patch tokens ``x`` are read, never changed.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Attention heads.
        mlp_ratio (float): FFN hidden width / C. Default: 4.
        qkv_bias (bool): Projection biases. Default: True.
        drop_path (float): Stochastic depth of both branches. Default: 0.
        layer_scale_init_value (float): Initial ``g1``, ``g2``.
            Default: 1e-5.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        # Only the class token (first) queries: (B, 1 + N, C) -> (B, 1, C).
        self.attn = GlobalSoftmaxAttention(embed_dims, num_heads, qkv_bias)
        self.gamma1 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.ffn = MLP(embed_dims, int(embed_dims * mlp_ratio), nn.GELU)
        self.gamma2 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, cls_token: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Class token (B, 1, C) and patch tokens (B, N, C) -> (B, 1, C)."""
        joint = self.norm1(torch.cat((cls_token, tokens), dim=1))  # (B, 1 + N, C)
        cls_token = cls_token + self.drop_path(
            self.gamma1 * self.attn(joint, num_queries=1))
        return cls_token + self.drop_path(self.gamma2 * self.ffn(self.norm2(cls_token)))
