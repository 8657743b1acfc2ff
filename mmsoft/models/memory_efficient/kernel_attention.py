"""SOFT's low-rank kernel attention, keeping no kernel for backward.

:func:`low_rank_kernel_attention` has the arguments, values and gradients of
:func:`~mmsoft.models.layers.soft.soft_attention.low_rank_kernel_attention`,
``K1 . (middle . (K1^T V))`` with ``A = k(L, L)`` and ``K1 = k(Q, L)``, and
keeps for backward neither kernel nor the Newton iterates:

* :func:`recomputed_bottleneck_kernel`: ``A`` under activation checkpointing.
* :func:`~mmsoft.models.memory_efficient.newton_backward.kernel_inverse`:
  the Newton iteration keeps its operand alone.
* :func:`symmetric_scale`: SOFT++'s ``D^-1/2 . inverse . D^-1/2`` keeping its
  two inputs only.
* :func:`chunked_kernel_product`: ``K1 . (middle . (K1^T V))`` evaluating
  ``K1`` chunk by chunk in forward and again in backward: memory
  O(chunk * m + m * d) instead of O(N * m), with or without autograd.

Gradients of the product, with ``G = dL/d out``:

* ``d right = K1^T G``; ``d middle = d right . summary^T``;
  ``d summary = middle^T . d right``;
* per chunk: ``dK1 = G right^T + V d summary^T``; ``dV = K1 d summary``;
* through ``K1 = exp(E)``, ``E = Q L^T - |Q|^2/2 - |L|^2/2``: with
  ``dE = dK1 * K1``: ``dQ = dE L - rowsum(dE) Q`` and
  ``dL = dE^T Q - colsum(dE) L``; ``dQ0 = s dQ``.

Everything here computes in the dtype it is given (float32 or float64 under
autocast too, see :mod:`~mmsoft.models.ops.precision`).
"""
from typing import List, Optional, Tuple

import torch
from torch.utils.checkpoint import checkpoint

from ..ops.gaussian_kernel import bottleneck_kernel, gaussian_kernel
from ..ops.kernel_inverse import scaled_both_sides
from ..ops.precision import apply_without_autocast, backward_without_autocast
from .newton_backward import kernel_inverse

BACKWARD_CHUNK = 1024  # tokens per slice of backward's N x m temporaries


# --------------------------------------------------------------------------
# The bottleneck kernel A = k(L, L)
# --------------------------------------------------------------------------
def recomputed_bottleneck_kernel(bottleneck: torch.Tensor) -> torch.Tensor:
    """``A = k(L, L)``, evaluated again in backward instead of kept.

    Args:
        bottleneck (Tensor): L, shape (B, h, m, d).

    Returns:
        Tensor: Shape (B, h, m, m).
    """
    if not torch.is_grad_enabled():
        return bottleneck_kernel(bottleneck)  # nothing to keep
    return checkpoint(bottleneck_kernel, bottleneck, use_reentrant=False)


# --------------------------------------------------------------------------
# SOFT++'s symmetric scaling
# --------------------------------------------------------------------------
class SymmetricScale(torch.autograd.Function):
    """Autograd function of :func:`symmetric_scale`: keeps ``mat`` and
    ``scale`` only.

    With ``G = dL/dout`` and ``o`` the element-wise product:
    ``d mat = G o (scale scale^T)``;
    ``d scale = (G o mat) scale + (G o mat)^T scale``.
    """

    @staticmethod
    def forward(ctx, mat, scale):
        ctx.save_for_backward(mat, scale)
        return scaled_both_sides(mat, scale)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        mat, scale = ctx.saved_tensors
        weighted = grad_out * mat  # (..., m, m)
        column = scale.unsqueeze(-1)  # (..., m, 1)
        grad_mat = scaled_both_sides(grad_out, scale)
        grad_scale = weighted @ column + weighted.transpose(-1, -2) @ column
        return grad_mat, grad_scale.squeeze(-1)


def symmetric_scale(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(scale) . mat . diag(scale)`` without keeping an intermediate
    m x m product.

    SOFT++ scales the inverse of A so: ``mat`` the inverse,
    ``scale = diag(D^-1/2)``, the inverse square roots of A's row sums.

    Args:
        mat (Tensor): Shape (..., m, m).
        scale (Tensor): Shape (..., m).

    Returns:
        Tensor: Shape (..., m, m).
    """
    return apply_without_autocast(SymmetricScale, mat, scale)


# --------------------------------------------------------------------------
# K1 . (middle . (K1^T V)), chunk by chunk
# --------------------------------------------------------------------------
def _chunks(tokens: int, chunk: int) -> List[Tuple[int, int]]:
    return [(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk)]


def kernel_summary(queries: torch.Tensor, bottleneck: torch.Tensor,
                   values: torch.Tensor, chunk: int,
                   query_scale: float = 1.) -> torch.Tensor:
    """``summary = K1^T V`` accumulated chunk by chunk: (B, h, m, d)."""
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
    """``K1 . right`` computed chunk by chunk: (B, h, N, d)."""
    out = queries.new_empty(*queries.shape[:-1], right.shape[-1])
    for start, end in _chunks(queries.shape[-2], chunk):
        kernel = gaussian_kernel(queries[..., start:end, :] * query_scale,
                                 bottleneck)
        torch.matmul(kernel, right, out=out[..., start:end, :])
    return out


def _with_ones(points: torch.Tensor) -> torch.Tensor:
    """(..., n, d) -> (..., n, d + 1) with a last column of ones."""
    return torch.cat((points, torch.ones_like(points[..., :1])), -1)


class ChunkedKernelProduct(torch.autograd.Function):
    """Autograd function of :func:`chunked_kernel_product`: keeps Q0, L,
    ``middle``, V, ``summary`` and ``right``; no N x m tensor."""

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
            grad_right = whole_kernel.transpose(-1, -2) @ grad_out  # d right
        grad_middle = grad_right @ summary.transpose(-1, -2)  # (B, h, m, m)
        grad_summary = middle.transpose(-1, -2) @ grad_right  # (B, h, m, d)
        grad_queries = torch.empty_like(queries)
        grad_values = torch.empty_like(values)
        dims = queries.shape[-1]
        # One product gives both dK1 terms: [G, V] [right, d summary]^T.
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


def chunked_kernel_product(queries: torch.Tensor, bottleneck: torch.Tensor,
                           middle: torch.Tensor, values: torch.Tensor,
                           chunk: int, query_scale: float = 1.) -> torch.Tensor:
    """``k(Q, L) . (middle . (k(Q, L)^T V))``, keeping no ``k(Q, L)`` for
    backward (:class:`ChunkedKernelProduct`).

    Args:
        queries (Tensor): Q0, shape (B, h, N, d); the queries are
            ``Q = query_scale * Q0``.
        bottleneck (Tensor): L, shape (B, h, m, d).
        middle (Tensor): Shape (B, h, m, m).
        values (Tensor): V, shape (B, h, N, d).
        chunk (int): Tokens per chunk; N or more: one chunk.
        query_scale (float): s. Default: 1.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    return apply_without_autocast(ChunkedKernelProduct, queries, bottleneck, middle,
                                  values, chunk, query_scale)


def low_rank_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                              values: torch.Tensor, variant: str, solver: str,
                              newton_iters: int, query_scale: float = 1.,
                              chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """:func:`~mmsoft.models.layers.soft.soft_attention.low_rank_kernel_attention`
    keeping neither Gaussian kernel nor the Newton iterates for backward, and
    holding at most ``chunk_tokens`` rows of ``K1`` at a time.

    Args:
        queries (Tensor): Queries Q0 before their scale, shape (B, h, N, d).
        bottleneck (Tensor): Bottleneck tokens L, shape (B, h, m, d).
        values (Tensor): Values V, shape (B, h, N, d).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
        newton_iters (int): Newton iterations.
        query_scale (float): s, the queries being ``Q = s Q0``. Default: 1.
        chunk_tokens (int, optional): Most rows of ``K1`` held at a time;
            None: all. Default: None.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    kernel_a = recomputed_bottleneck_kernel(bottleneck)  # A: (B, h, m, m)
    middle = kernel_inverse(kernel_a, variant, solver, newton_iters)  # (B, h, m, m)
    if variant == 'soft++':
        # D^-1/2 . middle . D^-1/2, D = diag(A 1): (B, h, m, m)
        middle = symmetric_scale(middle, kernel_a.sum(-1).rsqrt())
    tokens = queries.shape[-2]
    chunk = tokens if chunk_tokens is None else min(chunk_tokens, tokens)
    return chunked_kernel_product(queries, bottleneck, middle, values, chunk,
                                  query_scale)
