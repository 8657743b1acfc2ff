"""UFO-ViT's attention: ``XNorm(Q) . XNorm(K^T V)`` in O(N d^2).

``XNorm(x) = gamma x / |x|_2``: Q is normalised per token, ``K^T V`` per
column, so its columns are unit centroids and the outputs cosines bounded by
``|gamma_q gamma_kv|``. :func:`xnorm_attention` runs the reference
(:func:`ufo_attention`, plain autograd) or the training implementation
(:class:`XNormAttention`: Triton's kernels on CUDA), which keeps Q, K, V and
``K^T V`` for its written-out backward.
"""
from typing import Optional, Tuple

import torch

from ._library import (autocast_off, backward_without_autocast, full_precision,
                       register, runs_reference, runs_triton, strided_like)


def ufo_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  gamma_q: torch.Tensor, gamma_kv: torch.Tensor,
                  eps: float = 1e-6) -> torch.Tensor:
    """``XNorm(Q) . XNorm(K^T V)`` per head, ``XNorm(x) = gamma x / |x|_2``.

    Q (B, h, N, d_k) is normalised per token, K^T V (B, h, d_k, d_v) per
    column. Right to left, Q's norms scale the rows of the product: O(N d_k
    d_v). Returns (B, h, N, d_v) in float32 (float64 for float64 input);
    ``eps`` bounds the norms from below; gammas (h, )."""
    with autocast_off(queries.device.type):
        queries = full_precision(queries)
        keys = full_precision(keys).to(queries.dtype)
        values = full_precision(values).to(queries.dtype)

        context = keys.transpose(-2, -1) @ values  # K^T V: (B, h, d_k, d_v)
        context_norm = torch.linalg.vector_norm(context, dim=-2, keepdim=True)
        gamma = (gamma_q * gamma_kv).to(queries.dtype).view(-1, 1, 1)
        context = context * (gamma / context_norm.clamp_min(eps))  # (B, h, d_k, d_v)

        query_norm = torch.linalg.vector_norm(queries, dim=-1, keepdim=True)
        return (queries @ context) / query_norm.clamp_min(eps)  # (B, h, N, d_v)


def qkv_heads(qkv: torch.Tensor, num_heads: int,
              key_mask: Optional[torch.Tensor] = None):
    """(B, N, 3C) -> Q, K, V (B, h, N, d), views; K zero where ``key_mask``
    (B, N) is False (then K is a new tensor)."""
    batch, tokens, channels = qkv.shape
    heads = qkv.view(batch, tokens, 3, num_heads, channels // (3 * num_heads))
    queries, keys, values = heads.permute(2, 0, 3, 1, 4).unbind(0)
    if key_mask is not None:
        keys = keys.masked_fill(~key_mask[:, None, :, None], 0.)
    return queries, keys, values


def merged(heads: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    batch, num_heads, tokens, dims = heads.shape
    return heads.transpose(1, 2).reshape(batch, tokens, num_heads * dims)


def xnorm_attention_reference(qkv: torch.Tensor, num_heads: int, gamma_q: torch.Tensor,
                              gamma_kv: torch.Tensor,
                              key_mask: Optional[torch.Tensor] = None,
                              eps: float = 1e-6) -> torch.Tensor:
    """:func:`ufo_attention` of the heads of ``qkv`` (B, N, 3C): (B, N, C)."""
    queries, keys, values = qkv_heads(qkv, num_heads, key_mask)
    return merged(ufo_attention(queries, keys, values, gamma_q, gamma_kv, eps))


# --- The training implementation
def _xnorm_forward_shapes(qkv, num_heads, gamma_q, gamma_kv, key_mask, eps):
    batch, tokens, channels = qkv.shape
    dims = channels // (3 * num_heads)
    return (qkv.new_empty(batch, tokens, channels // 3),
            qkv.new_empty(batch, num_heads, dims, dims))


@register('xnorm_attention_forward', launches=3, fake=_xnorm_forward_shapes)
def xnorm_attention_forward(qkv: torch.Tensor, num_heads: int, gamma_q: torch.Tensor,
                            gamma_kv: torch.Tensor, key_mask: Optional[torch.Tensor],
                            eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The attention (B, N, C) of ``qkv`` (B, N, 3C) and its ``K^T V`` (B, h, d, d)."""
    if runs_triton(qkv):
        from .triton.xnorm import xnorm_forward
        return xnorm_forward(qkv, num_heads, gamma_q, gamma_kv, key_mask, eps)

    queries, keys, values = qkv_heads(qkv, num_heads, key_mask)
    context = keys.transpose(-2, -1) @ values  # (B, h, d, d)
    normalised = context / torch.linalg.vector_norm(
        context, dim=-2, keepdim=True).clamp_min(eps)  # u
    gamma = (gamma_q * gamma_kv).view(-1, 1, 1)
    out = (queries @ (gamma * normalised)) / torch.linalg.vector_norm(
        queries, dim=-1, keepdim=True).clamp_min(eps)
    return merged(out), context


def _unit_backward(unit: torch.Tensor, norm: torch.Tensor, grad: torch.Tensor,
                   dim: int, eps: float) -> torch.Tensor:
    """The gradient of x from that of ``u = x / max(|x|, eps)`` (norms over
    ``dim``): ``(du - u (u . du)) / |x|`` where |x| >= eps, else ``du / eps``."""
    radial = (unit * grad).sum(dim, keepdim=True) * (norm >= eps)
    return (grad - unit * radial) / norm.clamp_min(eps)


def _xnorm_backward_shapes(grad_out, qkv, context, num_heads, gamma_q, gamma_kv,
                           key_mask, eps):
    return torch.empty_like(qkv), torch.empty_like(gamma_q), torch.empty_like(gamma_kv)


@register('xnorm_attention_backward', launches=3, fake=_xnorm_backward_shapes)
def xnorm_attention_backward(grad_out: torch.Tensor, qkv: torch.Tensor,
                             context: torch.Tensor, num_heads: int,
                             gamma_q: torch.Tensor, gamma_kv: torch.Tensor,
                             key_mask: Optional[torch.Tensor], eps: float
                             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``qkv``, gamma_q and gamma_kv.

    With ``q^ = q / max(|q|, eps)``, ``u`` the columns of ``C = K^T V`` over
    ``max(|C_c|, eps)``, ``g = gamma_q gamma_kv`` and G: ``d(g u) = Q^^T G``,
    ``dq^ = G (g u)^T``, ``dg = sum(u o d(g u))``, ``du = g d(g u)``; dq and
    dC by :func:`_unit_backward`; ``dK = V dC^T`` (zero for masked keys),
    ``dV = K dC``.
    """
    if runs_triton(qkv):
        from .triton.xnorm import xnorm_backward
        return xnorm_backward(grad_out, qkv, context, num_heads, gamma_q, gamma_kv,
                              key_mask, eps)

    queries, keys, values = qkv_heads(qkv, num_heads, key_mask)
    batch, tokens, channels = grad_out.shape
    grad = grad_out.view(batch, tokens, num_heads, -1).transpose(1, 2)  # (B, h, N, d)
    gamma = (gamma_q * gamma_kv).view(-1, 1, 1)

    query_norm = torch.linalg.vector_norm(queries, dim=-1, keepdim=True)
    unit_queries = queries / query_norm.clamp_min(eps)  # q^
    context_norm = torch.linalg.vector_norm(context, dim=-2, keepdim=True)
    unit_context = context / context_norm.clamp_min(eps)  # u
    grad_scaled = unit_queries.transpose(-1, -2) @ grad  # d(g u): (B, h, d, d)
    grad_gamma = (unit_context * grad_scaled).sum((0, 2, 3))  # (h, )
    grad_queries = _unit_backward(unit_queries, query_norm,
                                  grad @ (gamma * unit_context).transpose(-1, -2), -1,
                                  eps)
    grad_context = _unit_backward(unit_context, context_norm, gamma * grad_scaled, -2,
                                  eps)

    grad_keys = values @ grad_context.transpose(-1, -2)  # (B, h, N, d)
    if key_mask is not None:
        grad_keys = grad_keys.masked_fill(~key_mask[:, None, :, None], 0.)
    grad_qkv = torch.stack((grad_queries, grad_keys, keys @ grad_context), 2)
    grad_qkv = grad_qkv.permute(0, 3, 2, 1, 4).reshape(qkv.shape)  # (B, N, 3C)
    return strided_like(grad_qkv, qkv), grad_gamma * gamma_kv, grad_gamma * gamma_q


class XNormAttention(torch.autograd.Function):
    """``XNorm(Q) . XNorm(K^T V)`` of ``qkv`` in full precision, keeping ``qkv``
    (in its own dtype) and ``K^T V``; backward :func:`xnorm_attention_backward`."""

    @staticmethod
    def forward(ctx, qkv, num_heads, gamma_q, gamma_kv, key_mask, eps):
        out, context = xnorm_attention_forward(full_precision(qkv), num_heads, gamma_q,
                                               gamma_kv, key_mask, eps)
        ctx.save_for_backward(qkv, context, gamma_q, gamma_kv, key_mask)
        ctx.num_heads, ctx.eps = num_heads, eps
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        qkv, context, gamma_q, gamma_kv, key_mask = ctx.saved_tensors
        grad_qkv, grad_gamma_q, grad_gamma_kv = xnorm_attention_backward(
            grad_out, full_precision(qkv), context, ctx.num_heads, gamma_q, gamma_kv,
            key_mask, ctx.eps)
        return grad_qkv, None, grad_gamma_q, grad_gamma_kv, None, None


def xnorm_attention(qkv: torch.Tensor, num_heads: int, gamma_q: torch.Tensor,
                    gamma_kv: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                    eps: float = 1e-6, fused: bool = True) -> torch.Tensor:
    """UFO attention of the projections ``qkv`` (B, N, 3C), Q | K | V of ``num_heads``
    heads each: (B, N, C) in float32 (float64 for float64 input). Tokens where
    ``key_mask`` (B, N) is False are no keys. ``fused``: the training
    implementation."""
    if runs_reference(fused, qkv):
        return xnorm_attention_reference(qkv, num_heads, gamma_q, gamma_kv, key_mask,
                                         eps)
    with autocast_off(qkv.device.type):
        return XNormAttention.apply(qkv, num_heads, gamma_q, gamma_kv, key_mask, eps)
