"""``K1 . (M . (K1^T V))`` over chunks of tokens, never holding the N x m kernel.

``K1 = k(Q, L)`` is the Gaussian kernel between the N queries and the m
bottleneck tokens; it is the largest tensor of SOFT attention (N x m per head).
The product only ever needs ``K1^T V`` (m x d) and, per chunk of tokens, that
chunk's rows of ``K1``, so both the forward and the backward pass recompute
the kernel chunk by chunk: memory O(chunk * m + m * d) instead of O(N * m),
for about three extra kernel evaluations in training (one when all tokens
fit in one chunk: forward and backward then evaluate the whole kernel once
each, and it is not kept in between). SOFT attention takes this path in
training at every token count, so autograd never keeps the kernel. The queries may come
unscaled with their scale ``s`` (``Q = s Q0``): the function then keeps
``Q0``, which the query projection's consumers keep anyway, and scales each
chunk as it goes.

Gradients, with ``T = M S``, ``S = K1^T V`` and ``G = dL/d out``:

* ``dT = K1^T G``; ``dM = dT S^T``; ``dS = M^T dT``;
* per chunk: ``dK1 = G T^T + V dS^T``; ``dV = K1 dS``;
* through ``K1 = exp(E)``, ``E = Q L^T - |Q|^2/2 - |L|^2/2``: with
  ``dE = dK1 * K1``: ``dQ = dE L - rowsum(dE) Q`` and
  ``dL = dE^T Q - colsum(dE) L``; ``dQ0 = s dQ``.
"""
from typing import Tuple

import torch

from .gaussian_kernel import gaussian_kernel
from ..shared.precision import apply_without_autocast, backward_without_autocast

BACKWARD_CHUNK = 1024  # tokens per slice of backward's N x m temporaries


def _chunks(tokens: int, chunk: int):
    return [(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk)]


def kernel_summary(queries: torch.Tensor, bottleneck: torch.Tensor,
                   values: torch.Tensor, chunk: int,
                   query_scale: float = 1.) -> torch.Tensor:
    """``S = K1^T V`` accumulated chunk by chunk: (B, h, m, d)."""
    summary = None
    for start, end in _chunks(queries.shape[-2], chunk):
        kernel = gaussian_kernel(queries[..., start:end, :] * query_scale,
                                 bottleneck)  # (B, h, c, m)
        part = kernel.transpose(-1, -2) @ values[..., start:end, :]
        summary = part if summary is None else summary.add_(part)
    return summary


def kernel_apply(queries: torch.Tensor, bottleneck: torch.Tensor,
                 right: torch.Tensor, chunk: int,
                 query_scale: float = 1.) -> torch.Tensor:
    """``K1 . R`` computed chunk by chunk: (B, h, N, d)."""
    out = queries.new_empty(*queries.shape[:-1], right.shape[-1])
    for start, end in _chunks(queries.shape[-2], chunk):
        kernel = gaussian_kernel(queries[..., start:end, :] * query_scale,
                                 bottleneck)
        torch.matmul(kernel, right, out=out[..., start:end, :])
    return out


class ChunkedKernelProduct(torch.autograd.Function):
    """Autograd function of :func:`chunked_kernel_product`."""

    @staticmethod
    def forward(ctx, queries, bottleneck, middle, values, chunk, query_scale):
        if queries.shape[-2] <= chunk:
            # One chunk: the kernel serves both products, evaluated once and
            # dropped.
            kernel = gaussian_kernel(queries * query_scale, bottleneck)  # (B,h,N,m)
            summary = kernel.transpose(-1, -2) @ values  # (B, h, m, d)
            right = middle @ summary  # (B, h, m, d)
            out = kernel @ right  # (B, h, N, d)
        else:
            summary = kernel_summary(queries, bottleneck, values, chunk, query_scale)
            right = middle @ summary
            out = kernel_apply(queries, bottleneck, right, chunk, query_scale)
        ctx.save_for_backward(queries, bottleneck, middle, values, summary, right)
        ctx.chunk = chunk
        ctx.query_scale = query_scale
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        queries, bottleneck, middle, values, summary, right = ctx.saved_tensors
        scale = ctx.query_scale
        tokens = queries.shape[-2]
        # Backward's N x m temporaries (the kernel's rows and their gradient)
        # come in slices of at most BACKWARD_CHUNK tokens: same products,
        # smaller peak.
        step = min(ctx.chunk, BACKWARD_CHUNK)
        # One chunk: its kernel serves both passes, evaluated once.
        whole_kernel = (gaussian_kernel(queries * scale, bottleneck)
                        if tokens <= ctx.chunk else None)  # (B, h, N, m)
        if whole_kernel is None:
            grad_right = kernel_summary(queries, bottleneck, grad_out, step, scale)
        else:
            grad_right = whole_kernel.transpose(-1, -2) @ grad_out  # dT
        grad_middle = grad_right @ summary.transpose(-1, -2)  # (B, h, m, m)
        grad_summary = middle.transpose(-1, -2) @ grad_right  # (B, h, m, d)
        grad_queries = torch.empty_like(queries)
        grad_values = torch.empty_like(values)
        dims = queries.shape[-1]
        # One product gives both dK1 terms: [G, V] [T, dS]^T.
        right_and_grad = torch.cat((right, grad_summary), -1)  # (B, h, m, 2d)
        # A column of ones makes each product also return the row or column
        # sums of dE: [L, 1] and [Q, 1].
        bottleneck_ones = _with_ones(bottleneck)  # (B, h, m, d + 1)
        bottleneck_grad = torch.zeros_like(bottleneck_ones)  # [dE^T Q, colsum dE]
        for start, end in _chunks(tokens, step):
            q = queries[..., start:end, :] * scale  # (B, h, c, d)
            kernel = (gaussian_kernel(q, bottleneck) if whole_kernel is None
                      else whole_kernel[..., start:end, :])  # (B, h, c, m)
            grad_values[..., start:end, :] = kernel @ grad_summary
            grad_and_values = torch.cat((grad_out[..., start:end, :],
                                         values[..., start:end, :]), -1)  # (B,h,c,2d)
            grad_kernel = grad_and_values @ right_and_grad.transpose(-1, -2)
            grad_exponent = grad_kernel.mul_(kernel)  # dE, (B, h, c, m)
            query_grad = grad_exponent @ bottleneck_ones  # [dE L, rowsum dE]
            grad_queries[..., start:end, :] = scale * (
                query_grad[..., :dims] - query_grad[..., dims:] * q)
            bottleneck_grad += grad_exponent.transpose(-1, -2) @ _with_ones(q)
        grad_bottleneck = (bottleneck_grad[..., :dims]
                           - bottleneck_grad[..., dims:] * bottleneck)
        return grad_queries, grad_bottleneck, grad_middle, grad_values, None, None


def _with_ones(points: torch.Tensor) -> torch.Tensor:
    """(..., n, d) -> (..., n, d + 1) with a last column of ones."""
    return torch.cat((points, torch.ones_like(points[..., :1])), -1)


def chunked_kernel_product(queries: torch.Tensor, bottleneck: torch.Tensor,
                           middle: torch.Tensor, values: torch.Tensor,
                           chunk: int, query_scale: float = 1.) -> torch.Tensor:
    """``k(Q, L) . (M . (k(Q, L)^T V))`` without materialising ``k(Q, L)``.

    Args:
        queries (Tensor): Q0, shape (B, h, N, d); the queries are
            ``Q = query_scale * Q0``.
        bottleneck (Tensor): L, shape (B, h, m, d).
        middle (Tensor): M, shape (B, h, m, m).
        values (Tensor): V, shape (B, h, N, d).
        chunk (int): Tokens per chunk.
        query_scale (float): s. Default: 1.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    if torch.jit.is_tracing():
        # Tracers (FLOP counting) record the operations themselves, and the
        # kernel is evaluated twice, as it is here. ``kernel_apply`` writes
        # through ``matmul(out=...)``, which mmengine's matmul handle cannot
        # read, hence the concatenation.
        queries = queries * query_scale
        right = middle @ kernel_summary(queries, bottleneck, values, chunk)
        return torch.cat([gaussian_kernel(queries[..., start:end, :], bottleneck) @ right
                          for start, end in _chunks(queries.shape[-2], chunk)], dim=-2)
    return apply_without_autocast(ChunkedKernelProduct, queries, bottleneck, middle,
                                  values, chunk, query_scale)
