"""XCiT's class-attention block."""
import torch
from mmpretrain.models.backbones.xcit import \
    ClassAttentionBlock as XCiTClassAttentionBlock

from ..utils import (check_divisible, check_mlp_ratio, check_positive_float,
                     check_positive_int, check_rate)


class ClassAttentionBlock(XCiTClassAttentionBlock):
    """mmpretrain's XCiT class-attention block with checked arguments. On
    ``[cls; p]`` it gives ``[cls'; 2 * (p + g1 * LN1(p))]`` as XCiT does
    (:meth:`forward_sequence`); :meth:`forward` returns ``cls'`` alone."""

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5):
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('num_heads', num_heads)
        check_divisible('embed_dims', [embed_dims], 'num_heads', [num_heads])
        check_rate('drop_path', drop_path)
        check_mlp_ratio('mlp_ratio', mlp_ratio, embed_dims)
        check_positive_float('layer_scale_init_value', layer_scale_init_value)
        super().__init__(dim=embed_dims, num_heads=num_heads, mlp_ratio=mlp_ratio,
                         qkv_bias=qkv_bias, drop_path=drop_path,
                         layer_scale_init_value=layer_scale_init_value,
                         tokens_norm=False)
        self.embed_dims = embed_dims

    def forward_sequence(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)

    def forward(self, cls_token: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The new class token (B, 1, C) of the class and patch tokens."""
        joint = torch.cat((cls_token, tokens), dim=1)  # (B, 1 + N, C)
        return self.forward_sequence(joint)[:, :1]
