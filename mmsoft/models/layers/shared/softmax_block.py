"""A pre-norm softmax-attention block (SOFT's last stage, as in PVT)."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath

from .attention_heads import merge_heads, split_heads
from .mlp import MLP
from ...ops.valid_region import ValidShapes, valid_mask


class GlobalSoftmaxAttention(nn.Module):
    """Multi-head softmax attention over all tokens.

    Every token is a query, a key and a value.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads.
        qkv_bias (bool): Bias of the query and key/value projections.
            Default: True.
    """

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
        """(B, N, C) -> (B, N, C).

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            key_mask (Tensor, optional): (B, N) bool, False for tokens that
                must not be attended to (padding). Default: None (all are).
        """
        queries = split_heads(self.q(x), self.num_heads)  # (B, h, N, d)
        keys, values = self.kv(x).chunk(2, dim=-1)
        keys = split_heads(keys, self.num_heads)
        values = split_heads(values, self.num_heads)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(  # (B, h, N, d)
            queries, keys, values, attn_mask=attn_mask)
        return self.proj(merge_heads(out))


class SoftmaxBlock(nn.Module):
    """``x = x + attn(LN(x)); x = x + MLP(LN(x))`` with softmax attention.

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
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw_shape=None,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """(B, N, C) -> (B, N, C).

        Args:
            x (Tensor): Tokens, shape (B, N, C): any leading extra tokens
                (a class token) followed by the H * W grid tokens.
            hw_shape (tuple[int, int], optional): The grid (H, W); needed
                only with ``valid_shapes``.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid; the grid tokens outside it are not
                attended to. Default: None (all are).
        """
        key_mask = None
        if valid_shapes is not None:
            key_mask = grid_key_mask(x, hw_shape, valid_shapes)
        x = x + self.drop_path(self.attn(self.norm1(x), key_mask=key_mask))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def grid_key_mask(x: torch.Tensor, hw_shape, valid_shapes: ValidShapes) -> torch.Tensor:
    """(B, N) bool: True for the leading extra tokens and the valid grid tokens.

    Args:
        x (Tensor): Tokens, shape (B, N, C), N = extra + H * W.
        hw_shape (tuple[int, int]): The grid (H, W).
        valid_shapes (list[tuple[int, int]]): Valid regions of the grid.
    """
    inside = valid_mask(valid_shapes, hw_shape, x.device).flatten(1)  # (B, H*W)
    extra = x.new_ones(x.shape[0], x.shape[1] - inside.shape[1], dtype=torch.bool)
    return torch.cat((extra, inside), dim=1)
