"""UFO attention: softmax-free self-attention with XNorm, linear in tokens."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ....utils import check_divisible, check_positive_int
from ...memory_efficient.recompute import recomputed
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from ...ops.precision import full_precision
from ..shared.attention_heads import merge_heads, split_heads
from ..shared.layer_scale import scaled_weight_and_bias


def xnorm(x: torch.Tensor, gamma: torch.Tensor, dim: int,
          eps: float = 1e-6) -> torch.Tensor:
    """``XNorm(x) = gamma * x / ||x||_2``, the L2 norm taken along ``dim``.

    Every vector along ``dim`` is projected onto the sphere of radius
    ``|gamma|``; a vector whose norm is below ``eps`` is divided by ``eps``
    instead (it stays near zero). Runs in float32 or float64 whatever the
    autocast state: half/bfloat16 inputs are cast to float32 first.

    Args:
        x (Tensor): Input of any shape.
        gamma (Tensor): Scales broadcastable against ``x``, e.g. one per head
            with shape (h, 1, 1) for ``x`` of shape (B, h, N, d).
        dim (int): Axis whose vectors are normalised.
        eps (float): Lower bound of the divisor. Default: 1e-6.

    Returns:
        Tensor: Same shape as ``x``, float32 (or float64 for float64 input).
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = full_precision(x)
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(eps)
        return gamma.to(x.dtype) * (x / norm)


def ufo_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  gamma_q: torch.Tensor, gamma_kv: torch.Tensor,
                  eps: float = 1e-6) -> torch.Tensor:
    """``XNorm(Q) . XNorm(K^T V)`` per head, evaluated right to left.

    ``K^T V`` (d_k x d_v per head) is formed first, so cost and memory are
    O(N d_k d_v) and no (N, N) matrix exists. The two XNorms use different
    axes:

    * ``Q`` is normalised per token over its d_k head channels (dim -1), so
      every query is a vector of length ``|gamma_q|`` in the d_k-dimensional
      query space.
    * ``K^T V`` is normalised over its d_k axis (dim -2): each of its d_v
      columns becomes a vector of length ``|gamma_kv|`` in that same query
      space, a "centroid" that the keys weighted by one value channel point
      to.

    Output entry ``(n, j)`` is then ``gamma_q * gamma_kv * cos(q_n, c_j)``, a
    cosine between query ``n`` and centroid ``j``, bounded by
    ``|gamma_q * gamma_kv|`` for any input. The sum over N in ``K^T V`` is
    divided out by the norm, so the output does not scale with the token
    count.

    Everything runs in float32 (float64 for float64 input), autocast or not.

    Args:
        queries (Tensor): Q, shape (B, h, N, d_k).
        keys (Tensor): K, shape (B, h, N, d_k).
        values (Tensor): V, shape (B, h, N, d_v).
        gamma_q (Tensor): XNorm scale of Q, one per head, shape (h, ).
        gamma_kv (Tensor): XNorm scale of K^T V, one per head, shape (h, ).
        eps (float): Lower bound of the XNorm divisors. Default: 1e-6.

    Returns:
        Tensor: Shape (B, h, N, d_v), float32 or float64.
    """
    with torch.autocast(device_type=queries.device.type, enabled=False):
        queries = full_precision(queries)
        keys = full_precision(keys).to(queries.dtype)
        values = full_precision(values).to(queries.dtype)
        context = keys.transpose(-2, -1) @ values  # (B, h, d_k, d_v)
        context = xnorm(context, gamma_kv.view(-1, 1, 1), dim=-2, eps=eps)
        queries = xnorm(queries, gamma_q.view(-1, 1, 1), dim=-1, eps=eps)
        return queries @ context  # (B, h, N, d_v)


class UFOAttention(MemoryEfficient, BaseModule):
    """UFO self-attention: ``proj(XNorm(Q) . XNorm(K^T V))``.

    Q, K and V come from one Linear layer and are split into heads; each head
    has one learnable XNorm scale for Q (``gamma_q``) and one for K^T V
    (``gamma_kv``), both initialised to 1, so a freshly built layer outputs
    cosines in [-1, 1] before the projection. See :func:`ufo_attention` for
    which axis each XNorm normalises. Memory and time are linear in
    the token count N. Under ``torch.autocast`` the K^T V product and both
    norms run in float32; the result is cast back to the dtype of V before
    the output projection. Parameter names ``qkv`` and ``proj`` are those
    of XCiT's ``XCA``, which UFO attention replaces
    (``docs/ufo_vit_design.md``).

    Memory-efficient path (:func:`takes_memory_efficient_path`): backward
    recomputes the attention from Q, K and V instead of keeping its
    intermediate tensors
    (:func:`~mmsoft.models.memory_efficient.recompute.recomputed`).

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Number of heads; ``embed_dims`` must be a multiple.
            Default: 8.
        qkv_bias (bool): Whether the QKV projection has a bias. Default: True.
        proj_drop (float): Dropout after the output projection. Default: 0.
        eps (float): Lower bound of the XNorm divisors. Default: 1e-6.
        init_cfg (dict, optional): Initialization config. Default: None.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int = 8,
                 qkv_bias: bool = True,
                 proj_drop: float = 0.,
                 eps: float = 1e-6,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
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

    def attend(self, x: torch.Tensor,
               key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention before the output projection.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            key_mask (Tensor, optional): (B, N) bool, False for tokens left
                out of the ``K^T V`` sum (padding: their keys are zeroed).
                Every other step is per token. Default: None (all take part).

        Returns:
            Tensor: Shape (B, h, N, C / h), in the dtype of V, every entry
            bounded by ``|gamma_q * gamma_kv|`` of its head.
        """
        queries, keys, values = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, N, C)
        queries = split_heads(queries, self.num_heads)  # (B, h, N, d)
        keys = split_heads(keys, self.num_heads)  # (B, h, N, d)
        if key_mask is not None:
            keys = keys.masked_fill(~key_mask[:, None, :, None], 0.)
        values = split_heads(values, self.num_heads)  # (B, h, N, d)
        args = (queries, keys, values, self.gamma_q, self.gamma_kv, self.eps)
        if takes_memory_efficient_path(self):
            out = recomputed(ufo_attention, *args)
        else:
            out = ufo_attention(*args)  # XNorm(Q) . XNorm(K^T V): (B, h, N, d)
        return out.to(values.dtype)

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                layer_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``layer_scale * proj(attend(x))``, then dropout.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            key_mask (Tensor, optional): As in :meth:`attend`. Default: None.
            layer_scale (Tensor, optional): Per-channel output scale, shape
                (C, ), folded into ``proj``'s weight and bias. Default: None.

        Returns:
            Tensor: Shape (B, N, C).
        """
        out = merge_heads(self.attend(x, key_mask))  # (B, N, C)
        weight, bias = scaled_weight_and_bias(self.proj, layer_scale)
        return self.proj_drop(F.linear(out, weight, bias))  # (B, N, C)
