"""XCiT's class-attention block, called with the class token and the patch tokens."""
import torch
from mmpretrain.models.backbones.xcit import \
    ClassAttentionBlock as XCiTClassAttentionBlock

from ..utils import (check_divisible, check_mlp_ratio, check_positive_float,
                     check_positive_int, check_rate)


class ClassAttentionBlock(XCiTClassAttentionBlock):
    """The class-attention block of mmpretrain's XCiT (as in timm's ``xcit.py``).

    On the sequence ``x = [cls; p]`` of the class token and the N patch
    tokens, with ``n = LN1(x)`` and ``CA`` softmax attention in which only
    the class token queries::

        c1    = cls + g1 * CA(n)                    (B, 1, C)
        cls'  = LN2(c1) + g2 * MLP(LN2(c1))         MLP residual from LN2(c1)
        p'    = 2 * (p + g1 * n[1:])                (B, N, C)

    :meth:`forward_sequence` returns ``[cls'; p']`` as XCiT's block does,
    doubled patch tokens included (its last residual adds the patch tokens
    to themselves; drop path, when training, applies to the added copy);
    XCiT chains its class-attention layers on this sequence.
    :meth:`forward` takes the class token and the patch tokens apart and
    returns ``cls'`` only.

    Parameters: ``norm1``, ``attn.{q,k,v,proj}``, ``norm2``, the MLP under
    mmpretrain's names ``ffn.layers.0.0`` (C -> hidden) and ``ffn.layers.1``
    (hidden -> C), ``gamma1``, ``gamma2``. LayerNorms with eps 1e-6, GELU.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Attention heads; must divide ``embed_dims``.
        mlp_ratio (float): MLP hidden width / C. Default: 4.
        qkv_bias (bool): Biases of the query, key and value projections.
            Default: True.
        drop_path (float): Stochastic depth of both residual branches, in
            [0, 1). Default: 0.
        layer_scale_init_value (float): Initial ``g1``, ``g2`` (> 0).
            Default: 1e-5.
    """

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
        """XCiT's block on the joint sequence: (B, 1 + N, C) -> (B, 1 + N, C)."""
        return super().forward(x)

    def forward(self, cls_token: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The new class token.

        Args:
            cls_token (Tensor): Shape (B, 1, C).
            tokens (Tensor): Patch tokens, shape (B, N, C); read, not changed.

        Returns:
            Tensor: Shape (B, 1, C).
        """
        joint = torch.cat((cls_token, tokens), dim=1)  # (B, 1 + N, C)
        return self.forward_sequence(joint)[:, :1]
