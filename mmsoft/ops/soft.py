"""SOFT's attention: ``K1 . middle . (K1^T V)``.

The Gaussian kernel ``K1 = k(Q, L)`` of the queries ``Q = s Q0`` and the
bottleneck tokens L, and ``middle`` from the kernel of L
(:mod:`.kernel_inverse`); computed right to left in O(N m d).
:func:`soft_attention` runs the reference (:func:`kernel_products_reference`
of the whole N x m kernel, :func:`~.kernel_inverse.middle_matrix`) or the
training implementation, which never stores the N x m kernel: it recomputes
it in chunks (Triton's tiles on CUDA) in forward and backward.
"""
from typing import List, Optional, Tuple

import torch

from ._library import (apply_without_autocast, autocast_off, backward_without_autocast,
                       register, runs_reference, runs_triton, strided_like)
from .kernel_inverse import (gaussian_kernel, kernel_of_operands, kernel_operands,
                             soft_middle)

#: On the CPU: most tokens per chunk of the kernel products, where they chunk
#: at all, and per slice of their backward (a cache's size).
CPU_CHUNK_TOKENS = 512
CPU_BACKWARD_CHUNK = 1024


def kernel_products_reference(queries: torch.Tensor, bottleneck: torch.Tensor,
                              middle: torch.Tensor, values: torch.Tensor,
                              scale: float) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``, ``K1 = k(s Q0, L)``: Q0 (B, h, N, d), L (B, h,
    m, d), middle (B, h, m, m) and V (B, h, N, d) -> (B, h, N, d)."""
    kernel = gaussian_kernel(scale * queries, bottleneck)  # K1: (B, h, N, m)
    return kernel @ (middle @ (kernel.transpose(-1, -2) @ values))


# --- The training implementation
def _chunks(tokens: int, chunk: int) -> List[Tuple[int, int]]:
    return [(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk)]


def kernel_summary(left, right, values, chunk: int) -> torch.Tensor:
    """``K1^T V`` chunk by chunk, ``K1 = exp(left . right^T)``: (B, h, m, d)."""
    summary = None
    for start, end in _chunks(left.shape[-2], chunk):
        kernel = kernel_of_operands(left[..., start:end, :], right)  # (B, h, c, m)
        part = kernel.transpose(-1, -2) @ values[..., start:end, :]
        summary = part if summary is None else summary.add_(part)
    return summary


def merged_heads_like(values: torch.Tensor) -> torch.Tensor:
    """An empty (B, h, N, d) tensor laid out as (B, N, h, d): its heads merge
    into (B, N, h * d) as a view."""
    batch, heads, tokens, dims = values.shape
    return values.new_empty(batch, tokens, heads, dims).transpose(1, 2)


def _products_forward_shapes(queries, bottleneck, middle, values, scale, chunk):
    summary = values.new_empty(*bottleneck.shape[:-1], values.shape[-1])
    return merged_heads_like(values), summary, torch.empty_like(summary)


@register('kernel_products_forward', launches=3, fake=_products_forward_shapes)
def kernel_products_forward(queries: torch.Tensor, bottleneck: torch.Tensor,
                            middle: torch.Tensor, values: torch.Tensor, scale: float,
                            chunk: int
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``out = K1 R`` (B, h, N, d, laid out as (B, N, h, d)), ``S = K1^T V`` and
    ``R = middle S`` (B, h, m, d), ``K1`` recomputed in chunks of ``chunk`` rows."""
    if runs_triton(queries):
        from .triton.soft_products import products_forward
        return products_forward(queries, bottleneck, middle, values, scale)

    left, right = kernel_operands(queries * scale, bottleneck)
    out = merged_heads_like(values)
    if queries.shape[-2] <= chunk:  # one kernel evaluation serves both products
        kernel = kernel_of_operands(left, right)  # (B, h, N, m)
        summary = kernel.transpose(-1, -2) @ values  # (B, h, m, d)
        factor = middle @ summary
        out.copy_(kernel @ factor)
        return out, summary, factor

    summary = kernel_summary(left, right, values, chunk)
    factor = middle @ summary
    for start, end in _chunks(queries.shape[-2], chunk):
        kernel = kernel_of_operands(left[..., start:end, :], right)  # (B, h, c, m)
        out[..., start:end, :] = kernel @ factor
    return out, summary, factor


def _products_backward_shapes(grad_out, queries, bottleneck, middle, values, summary,
                              factor, scale, chunk):
    return (torch.empty_like(queries), torch.empty_like(bottleneck),
            torch.empty_like(middle), torch.empty_like(values))


@register('kernel_products_backward', launches=4, fake=_products_backward_shapes)
def kernel_products_backward(grad_out: torch.Tensor, queries: torch.Tensor,
                             bottleneck: torch.Tensor, middle: torch.Tensor,
                             values: torch.Tensor, summary: torch.Tensor,
                             factor: torch.Tensor, scale: float, chunk: int
                             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor]:
    """The gradients of Q0, L, middle and V of :func:`kernel_products_forward`.

    With S, R, G, ``K1 = exp(E)``, ``E = A B^T``, ``A = [Q, -|Q|^2 / 2, 1]``,
    ``B = [L, 1, -|L|^2 / 2]``: ``dR = K1^T G``, ``d middle = dR S^T``, ``dS =
    middle^T dR``, ``dV = K1 dS``, ``dE = (G R^T + V dS^T) o K1``, ``dA = dE
    B``, ``dB = dE^T A``; ``dQ0 = s (dA_Q - dA_|Q| Q)``, ``dL = dB_L - dB_|L| L``.
    """
    if runs_triton(queries):
        from .triton.soft_products import products_backward
        return products_backward(grad_out, queries, bottleneck, middle, values,
                                 summary, factor, scale)

    scaled = queries * scale  # Q: (B, h, N, d)
    left, right = kernel_operands(scaled, bottleneck)  # (B, h, N | m, d + 2)
    tokens, dims = queries.shape[-2:]

    # The N x m temporaries in slices: a cache's size on the CPU, whole
    # chunks elsewhere; one chunk's kernel is evaluated once.
    step = min(chunk, CPU_BACKWARD_CHUNK) if queries.device.type == 'cpu' else chunk
    whole_kernel = (kernel_of_operands(left, right) if tokens <= chunk
                    else None)  # (B, h, N, m)
    if whole_kernel is None:
        grad_factor = kernel_summary(left, right, grad_out, step)
    else:
        grad_factor = whole_kernel.transpose(-1, -2) @ grad_out  # dR
    grad_middle = grad_factor @ summary.transpose(-1, -2)  # (B, h, m, m)
    grad_summary = middle.transpose(-1, -2) @ grad_factor  # (B, h, m, d)

    grad_left = torch.empty_like(left)
    grad_values = torch.empty_like(values)
    grad_right = torch.zeros_like(right)
    # One product gives both dK1 terms: [G, V] [R, dS]^T.
    factors_t = torch.cat((factor, grad_summary), -1).transpose(-1, -2)
    for start, end in _chunks(tokens, step):
        kernel = (kernel_of_operands(left[..., start:end, :], right)
                  if whole_kernel is None
                  else whole_kernel[..., start:end, :])  # (B, h, c, m)
        grad_values[..., start:end, :] = kernel @ grad_summary
        grad_and_values = torch.cat((grad_out[..., start:end, :],
                                     values[..., start:end, :]), -1)  # (B, h, c, 2d)
        grad_exponent = (grad_and_values @ factors_t).mul_(kernel)  # dE
        grad_left[..., start:end, :] = grad_exponent @ right
        grad_right += grad_exponent.transpose(-1, -2) @ left[..., start:end, :]

    grad_queries = scale * (grad_left[..., :dims]
                            - grad_left[..., dims:dims + 1] * scaled)
    grad_bottleneck = grad_right[..., :dims] - grad_right[..., dims + 1:] * bottleneck
    return (strided_like(grad_queries, queries),
            strided_like(grad_bottleneck, bottleneck),
            strided_like(grad_middle, middle), grad_values)


class KernelProducts(torch.autograd.Function):
    """``K1 . (middle . (K1^T V))`` keeping Q0, L, middle, V, S and R, never K1;
    backward :func:`kernel_products_backward`."""

    @staticmethod
    def forward(ctx, queries, bottleneck, middle, values, scale, chunk):
        out, summary, factor = kernel_products_forward(queries, bottleneck, middle,
                                                       values, scale, chunk)
        ctx.save_for_backward(queries, bottleneck, middle, values, summary, factor)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        grads = kernel_products_backward(grad_out, *ctx.saved_tensors, ctx.scale,
                                         ctx.chunk)
        return (*grads, None, None)


def soft_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                   values: torch.Tensor, scale: float, variant: str, solver: str,
                   newton_iters: int, token_counts: Optional[List[int]] = None,
                   inside: Optional[torch.Tensor] = None,
                   chunk_tokens: Optional[int] = None, fused: bool = True
                   ) -> torch.Tensor:
    """``K1 . middle . (K1^T V)``, ``K1 = k(s Q0, L)``, in float32 (float64 for
    float64 input): Q0 and V (B, h, N, d), L (B, h, m, d) -> (B, h, N, d).

    Image i's middle is that of its first ``token_counts[i]`` bottleneck
    tokens (``inside``: their (B, m) mask). ``fused``: the training
    implementation, which holds at most ``chunk_tokens`` rows of K1 at a time
    (fewer on the CPU)."""
    with autocast_off(queries.device.type):
        middle = soft_middle(bottleneck, variant, solver, newton_iters, token_counts,
                             inside, fused)  # (B, h, m, m)
        if runs_reference(fused, queries):
            return kernel_products_reference(queries, bottleneck, middle, values, scale)

        tokens = queries.shape[-2]
        chunk = min(chunk_tokens or tokens, tokens)
        if chunk < tokens and queries.device.type == 'cpu':
            chunk = min(chunk, CPU_CHUNK_TOKENS)  # evaluated twice: where caches hold
        return apply_without_autocast(KernelProducts, queries, bottleneck, middle,
                                      values, scale, chunk)
