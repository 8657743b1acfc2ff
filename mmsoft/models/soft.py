"""SOFT / SOFT++: softmax-free transformers with linear complexity.

Lu et al., NeurIPS 2021 and IJCV 2024. Attention is a Gaussian kernel with
shared queries and keys, low-rank through bottleneck tokens L:
``K1 . middle . (K1^T V)``, ``K1 = k(Q, L)``, ``middle`` the inverse of
``A = k(L, L)``: ``(A + 0.01 I)^-1`` (SOFT) or ``D^-1/2 pinv(A) D^-1/2``,
``D = diag(A 1)`` (SOFT++), by Newton's iteration as the papers, in closed
form or exactly (docs/soft_design.md).
"""
import math
from functools import partial
from itertools import islice
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoint.soft_official import soft_official_to_mmsoft
from ..deployment.traceable import traceable_cap_bottleneck_grid
from ..utils.validation import (check_choice, check_divisible, check_lengths,
                                check_positive_int, resolve_arch)
from .common import (MLP, ConvPatchEmbed, DenseBackbone, Regions, ValidShapes, recomputed,
                     autocast_off, backward_without_autocast, contiguous_gradient,
                     full_precision, gelu, init_transformer_weights, is_compiling,
                     is_tracing, merge_heads, pad_to_grid, per_distinct_shape,
                     regions_on_grid, split_heads, take_indices, tokens_as_map,
                     tokens_to_map, drop_path_or_identity, apply_without_autocast)

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'newton_closed_form', 'exact')
#: The solver an ONNX graph computes for each solver ONNX can express.
EXPORT_SOLVERS = {'newton': 'newton', 'newton_closed_form': 'newton'}
#: Device types where ``'newton_closed_form'`` uses ``eigh``; elsewhere it iterates.
CLOSED_FORM_DEVICES = ('cpu', )
EIGH_DTYPE = torch.float64
#: SOFT++ takes the pseudo-inverse of at least this many bottleneck tokens.
MIN_PSEUDO_INVERSE_TOKENS = 3
#: On the CPU: most tokens per chunk of the memory-saving kernel product,
#: where it chunks at all, and per slice of its backward (a cache's size).
CPU_CHUNK_TOKENS = 512
CPU_BACKWARD_CHUNK = 1024


# --- Gaussian kernel
def kernel_operands(x: torch.Tensor, y: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Operands whose product is the Gaussian kernel's exponent,
    ``[x, -|x|^2 / 2, 1] . [y, 1, -|y|^2 / 2]^T``: (..., N, d + 2), (..., M, d + 2)."""
    left = torch.cat((x, -0.5 * x.pow(2).sum(-1, keepdim=True),
                      torch.ones_like(x[..., :1])), -1)
    right = torch.cat((y, torch.ones_like(y[..., :1]),
                       -0.5 * y.pow(2).sum(-1, keepdim=True)), -1)
    return left, right


def kernel_of_operands(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``exp(left . right^T)`` (..., N, M) of :func:`kernel_operands`' operands."""
    return torch.matmul(left, right.transpose(-1, -2)).exp_()


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor,
                    float32_products: bool = False) -> torch.Tensor:
    """``k(x, y) = exp(-|x - y|^2 / 2)`` of (..., N, d) and (..., M, d): (..., N, M);
    ``float32_products``: the exponent float32-accurate under TF32."""
    left, right = kernel_operands(x, y)  # (..., N, d + 2), (..., M, d + 2)
    matmul = float32_matmul if float32_products else torch.matmul
    return matmul(left, right.transpose(-1, -2)).exp_()


# --- Float32 products under TF32
# Clears the 13 low mantissa bits of a float32: what TF32 keeps exactly.
_TF32_MASK = -(1 << 13)


def reduced_precision_matmuls(device: torch.device) -> bool:
    """Whether float32 matmuls on ``device`` may run in reduced precision (TF32)."""
    if is_compiling():
        return device.type == 'cuda'
    return torch.get_float32_matmul_precision() != 'highest'


def split_tf32(tensor: torch.Tensor):
    """``(high, low)`` with ``high + low == tensor`` and ``high`` TF32-exact."""
    tensor = tensor.detach()
    high = (tensor.view(torch.int32) & _TF32_MASK).view(torch.float32)
    return high, tensor - high


def three_pass_matmul(a: torch.Tensor, b: torch.Tensor, matmul=torch.matmul) -> torch.Tensor:
    """``a @ b`` as ``a_hi b_hi + a_hi b_lo + a_lo b_hi``, the parts TF32-exact."""
    a_high, a_low = split_tf32(a)
    b_high, b_low = split_tf32(b)
    return matmul(a_high, b_high) + (matmul(a_high, b_low) + matmul(a_low, b_high))


class Float32Matmul(torch.autograd.Function):
    """``a @ b`` and its gradients ``dA = G B^T``, ``dB = A^T G``, each by
    :func:`three_pass_matmul`."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return three_pass_matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # summed over broadcast dims
            grad_a = three_pass_matmul(grad, b.transpose(-1, -2)).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = three_pass_matmul(a.transpose(-1, -2), grad).sum_to_size(b.shape)
        return grad_a, grad_b


def float32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accurate to float32, also where matmuls run in TF32."""
    if a.dtype == torch.float32 and b.dtype == torch.float32 \
            and reduced_precision_matmuls(a.device):
        return Float32Matmul.apply(a, b)
    return torch.matmul(a, b)


def matmul_add(tensor: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               beta: float = 1., alpha: float = 1.) -> torch.Tensor:
    """``beta tensor + alpha a @ b`` on (n, N, K) x (n, K, M), float32-accurate:
    one ``baddbmm`` where matmuls are exact."""
    if a.dtype == torch.float32 and reduced_precision_matmuls(a.device):
        return beta * tensor + alpha * Float32Matmul.apply(a, b)
    return torch.baddbmm(tensor, a, b, beta=beta, alpha=alpha)


# --- The kernel inverse
def solver_that_runs(solver: str, device_type: str) -> str:
    """The solver run for ``solver`` on ``device_type``: the closed form iterates
    off the CPU, where ``eigh`` would wait for the host."""
    if solver == 'newton_closed_form' and device_type not in CLOSED_FORM_DEVICES:
        return 'newton'
    return solver


def inverse_formula(variant: str, tokens: int) -> str:
    """``variant``'s inverse of m tokens: ``'soft'``'s for ``'soft++'`` below 3."""
    if variant == 'soft++' and tokens < MIN_PSEUDO_INVERSE_TOKENS:
        return 'soft'
    return variant


def scaled_both_sides(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(scale) . mat . diag(scale)``: (..., m, m)."""
    return scale.unsqueeze(-1) * mat * scale.unsqueeze(-2)


def newton_operand(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """P: ``A + 0.01 I`` for ``'soft'``, ``A`` for ``'soft++'``."""
    if variant == 'soft':
        return mat + REGULARISER * torch.eye(mat.shape[-1], dtype=mat.dtype,
                                             device=mat.device)
    return mat


def newton_scale(mat: torch.Tensor, variant: str,
                 max_halvings: int = 10) -> torch.Tensor:
    """The step ``alpha`` of ``V_0 = alpha P``: SOFT's ``0.9 * 2 / (max row sum
    of A)^2`` per matrix; SOFT++'s ``2 / (max row sum)^2`` per image, halved
    while ``max colsum |I - alpha A^2| > 1.01`` (at most ``max_halvings``
    times). As A >= 0, column j's sum is ``|1 - alpha S_jj| + alpha (c_j -
    S_jj)``, ``c = A (A 1)``, ``S_jj = sum_k A_jk^2``; all halvings are tested
    at once, and as many apply as lead the failures."""
    row_sums = mat.sum(-1)  # A 1: (B, ..., m)
    if variant == 'soft':
        return (0.9 * 2 / row_sums.amax(-1).pow(2))[..., None, None]

    column_sums = (mat @ row_sums.unsqueeze(-1)).squeeze(-1)  # c: (B, ..., m)
    diagonal = mat.pow(2).sum(-1)  # S_jj: (B, ..., m)
    peak = row_sums.flatten(1).amax(1) if mat.dim() > 2 else row_sums.amax().reshape(1)
    alpha = (2 / peak.pow(2)).reshape(-1, *(1, ) * (mat.dim() - 1))  # (B, 1, ..., 1)
    images = alpha.shape[0]

    halvings = torch.arange(max_halvings, device=mat.device, dtype=mat.dtype)
    shape = (max_halvings, ) + (1, ) * diagonal.dim()
    step = alpha.squeeze(-1) * torch.pow(0.5, halvings).view(shape)  # (k, B, 1, ...)
    residual = (1 - step * diagonal).abs() + step * (column_sums - diagonal)
    too_large = residual.reshape(max_halvings, images, -1).amax(-1) > 1.01  # (k, B)
    failures = too_large.to(mat.dtype).cumsum(0)  # (k, B)
    count = (failures > halvings.view(-1, 1)).sum(0)  # the leading ones: (B, )
    return alpha * torch.pow(0.5, count.to(mat.dtype)).view(alpha.shape)


def newton_iterates(operand: torch.Tensor, alpha: torch.Tensor, num_iters: int):
    """Yields ``(V_j, V_j P)`` for ``j < k``, then ``(V_k, None)``: P (n, m, m),
    alpha (n, 1, 1); each step ``V <- 2V - (V P) V`` is two products."""
    inverse = alpha * operand  # V_0
    for _ in range(num_iters):
        product = float32_matmul(inverse, operand)  # V_j P
        yield inverse, product
        inverse = matmul_add(inverse, product, inverse, beta=2, alpha=-1)  # V_{j+1}
    yield inverse, None


def as_matrix_batch(operand: torch.Tensor, alpha: torch.Tensor):
    """P (..., m, m) and alpha (broadcasting to (..., 1, 1)) as (n, m, m), (n, 1, 1)."""
    alpha = alpha.expand(*operand.shape[:-2], 1, 1)
    return operand.reshape(-1, *operand.shape[-2:]), alpha.reshape(-1, 1, 1)


def newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                      num_iters: int) -> torch.Tensor:
    """``V_k`` (..., m, m): k steps of ``V <- 2V - (V P) V`` from ``V_0 = alpha P``."""
    for inverse, _ in newton_iterates(*as_matrix_batch(operand, alpha), num_iters):
        pass
    return inverse.view(operand.shape)


def newton_iterations_backward(operand: torch.Tensor, alpha: torch.Tensor,
                               num_iters: int, grad_output: torch.Tensor) -> torch.Tensor:
    """``dL/dP`` of :func:`newton_iterations`, G = dL/dV_k.

    With ``W = G_{j+1} V_j^T``: ``G_j = 2 G_{j+1} - W P^T - (V_j P)^T G_{j+1}``,
    ``dL/dP = alpha G_0 - sum_j V_j^T W``.
    """
    matrices, alpha = as_matrix_batch(operand, alpha)  # (n, m, m), (n, 1, 1)
    steps = list(islice(newton_iterates(matrices, alpha, num_iters), num_iters))

    grad = grad_output.reshape(matrices.shape)  # G_k
    grad_operand = torch.zeros_like(matrices)
    operand_t = matrices.transpose(-1, -2)

    for inverse, product in reversed(steps):
        weighted = float32_matmul(grad, inverse.transpose(-1, -2))  # W
        grad_operand = matmul_add(grad_operand, inverse.transpose(-1, -2), weighted,
                                  alpha=-1)
        grad = matmul_add(matmul_add(grad, weighted, operand_t, beta=2, alpha=-1),
                          product.transpose(-1, -2), grad, alpha=-1)  # G_j
    return torch.addcmul(grad_operand, alpha, grad).view(operand.shape)


def newton_on_eigenvalues(eigvals: torch.Tensor, alpha: torch.Tensor,
                          num_iters: int) -> torch.Tensor:
    """``g_k(l) = (1 - (1 - alpha l^2)^(2^k)) / l``, as ``v <- v (2 - l v)``."""
    value = alpha * eigvals
    for _ in range(num_iters):
        value = value * (2 - eigvals * value)
    return value


def newton_divided_difference_pairs(larger: torch.Tensor, smaller: torch.Tensor,
                                    alpha: torch.Tensor, num_iters: int) -> torch.Tensor:
    """``(g_k(a) - g_k(b)) / (a - b)`` for ``a >= b`` (``g_k'(a)`` at ``a = b``),
    by ``D <- D (2 - b (v_a + v_b)) - v_a^2`` from ``D_0 = alpha``."""
    value_a, value_b = alpha * larger, alpha * smaller
    diff = alpha
    for _ in range(num_iters):
        diff = diff * (2 - smaller * (value_a + value_b)) - value_a.pow(2)
        value_a = value_a * (2 - larger * value_a)
        value_b = value_b * (2 - smaller * value_b)
    return diff


def newton_divided_differences(eigvals: torch.Tensor, alpha: torch.Tensor,
                               num_iters: int, close: float = 1e-3) -> torch.Tensor:
    """``D[i, j] = (g_k(l_i) - g_k(l_j)) / (l_i - l_j)``, ``D[i, i] = g_k'(l_i)``."""
    values = newton_on_eigenvalues(eigvals, alpha, num_iters)  # (..., m)
    slopes = newton_divided_difference_pairs(eigvals, eigvals, alpha.expand_as(eigvals),
                                             num_iters)
    row, col = eigvals.unsqueeze(-1), eigvals.unsqueeze(-2)
    gap = row - col  # (..., m, m)
    relative_gap = gap.abs() / torch.maximum(row.abs(), col.abs())  # NaN at 0 - 0
    is_equal = ~(relative_gap > 1e-5 / 2**(num_iters + 1))  # the diagonal too
    is_close = ~(relative_gap > close)
    diff = torch.where(is_equal, 0.5 * (slopes.unsqueeze(-1) + slopes.unsqueeze(-2)),
                       (values.unsqueeze(-1) - values.unsqueeze(-2))
                       / torch.where(is_close, torch.ones_like(gap), gap))

    # Close pairs by the recursion, on one triangle, mirrored to the other.
    upper = torch.ones_like(is_close).triu_(1)
    index = (is_close & ~is_equal & upper).nonzero(as_tuple=True)
    if index[0].numel():
        first, second = row.expand_as(gap)[index], col.expand_as(gap)[index]
        pairs = newton_divided_difference_pairs(
            torch.maximum(first, second), torch.minimum(first, second),
            alpha.unsqueeze(-1).expand_as(gap)[index], num_iters)
        diff[index] = pairs
        diff[index[:-2] + (index[-1], index[-2])] = pairs
    return diff


class NewtonClosedForm(torch.autograd.Function):
    """``V_k = Q diag(g_k(lambda)) Q^T`` from one ``eigh`` of symmetric P.

    Backward: ``dL/dP = Q (D o (Q^T G Q)) Q^T``, D the divided differences of g_k.
    """

    @staticmethod
    def forward(ctx, operand, alpha, num_iters):
        eigvals, eigvecs = torch.linalg.eigh(operand.to(EIGH_DTYPE))  # (..., m), (..., m, m)
        alpha = alpha.squeeze(-1).to(EIGH_DTYPE)  # (..., 1)
        weights = newton_on_eigenvalues(eigvals, alpha, num_iters)
        eigvecs = eigvecs.to(operand.dtype)
        ctx.save_for_backward(eigvals, eigvecs, alpha)
        ctx.num_iters = num_iters
        return (eigvecs * weights.to(operand.dtype).unsqueeze(-2)) @ eigvecs.transpose(-1, -2)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        eigvals, eigvecs, alpha = ctx.saved_tensors
        diff = newton_divided_differences(eigvals, alpha, ctx.num_iters)
        inner = eigvecs.transpose(-1, -2) @ grad_output @ eigvecs
        grad = eigvecs @ (diff.to(inner.dtype) * inner) @ eigvecs.transpose(-1, -2)
        return grad, None, None


def newton_closed_form(operand: torch.Tensor, alpha: torch.Tensor,
                       num_iters: int) -> torch.Tensor:
    """:func:`newton_iterations` of symmetric P (..., m, m) from one ``eigh``."""
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(NewtonClosedForm, operand, alpha, num_iters)


def exact_inverse(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """``(A + 0.01 I)^-1`` by Cholesky (``'soft'``) or ``pinv(A)`` (``'soft++'``)."""
    if variant == 'soft':
        return torch.cholesky_inverse(torch.linalg.cholesky(newton_operand(mat, 'soft')))
    return torch.linalg.pinv(mat, hermitian=True)


class ExactInverse(torch.autograd.Function):
    """:func:`exact_inverse` without a graph; backward ``-V^T G V^T``."""

    @staticmethod
    def forward(ctx, mat, variant):
        with torch.no_grad():
            inverse = exact_inverse(mat, variant)
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        inverse_t = ctx.saved_tensors[0].transpose(-1, -2)
        return -(inverse_t @ grad_output @ inverse_t), None


def kernel_inverse(mat: torch.Tensor, variant: str = 'soft', solver: str = 'newton',
                   num_iters: int = 20, iterate=None) -> torch.Tensor:
    """Differentiable ``(A + 0.01 I)^-1`` (``'soft'``) or ``pinv(A)`` (``'soft++'``)
    of symmetric A (B, ..., m, m), B indexing images; float32 for half inputs.

    ``solver`` runs as :func:`solver_that_runs` says on A's device; ``iterate``
    is the Newton iteration (default: :func:`newton_iterations`)."""
    solver = solver_that_runs(solver, mat.device.type)

    variant = inverse_formula(variant, mat.shape[-1])
    with autocast_off(mat.device.type):
        mat = full_precision(mat)

        if solver == 'exact':
            return ExactInverse.apply(mat, variant)
        with torch.no_grad():
            alpha = newton_scale(mat, variant)  # (B, ..., 1, 1)

        operand = newton_operand(mat, variant)  # P

        if solver == 'newton_closed_form':
            return newton_closed_form(operand, alpha, num_iters)
        return (iterate or newton_iterations)(operand, alpha, num_iters)


def inverse_and_scaling(kernel_a: torch.Tensor, variant: str, solver: str,
                        newton_iters: int, iterate=None,
                        row_sum_fill: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``middle`` of A (B, h, m, m); ``row_sum_fill`` (B, 1, m) is added to A's
    row sums (1 for a padding token, whose row is zero)."""
    middle = kernel_inverse(kernel_a, variant, solver, newton_iters, iterate)
    if variant == 'soft++':
        row_sums = kernel_a.sum(-1)  # (B, h, m)

        if row_sum_fill is not None:
            row_sums = row_sums + row_sum_fill
        middle = scaled_both_sides(middle, row_sums.rsqrt())
    return middle


def middle_matrix(kernel_a: torch.Tensor, variant: str, solver: str,
                  newton_iters: int, iterate=None,
                  token_counts: Optional[List[int]] = None) -> torch.Tensor:
    """``middle`` of the bottleneck's kernel A = k(L, L) (B, h, m, m):
    ``(A + 0.01 I)^-1`` (``'soft'``) or ``D^-1/2 pinv(A) D^-1/2`` (``'soft++'``).

    Image i's middle is that of its first ``token_counts[i]`` tokens, zero
    elsewhere. Where Newton iterates, the images share it: A, zero outside each
    image's tokens, is block-diagonal, and so is every iterate."""
    tokens = kernel_a.shape[-1]
    if token_counts is None or all(count == tokens for count in token_counts):
        return inverse_and_scaling(kernel_a, variant, solver, newton_iters, iterate)

    formula = inverse_formula(variant, tokens)
    if (solver_that_runs(solver, kernel_a.device.type) == 'newton'
            and all(inverse_formula(variant, count) == formula for count in token_counts)):
        index = torch.arange(tokens, device=kernel_a.device)
        inside = torch.stack([index < count for count in token_counts])  # (B, m)
        inside = inside.to(kernel_a.dtype)[:, None]  # (B, 1, m)
        blocks = inside.unsqueeze(-1) * inside.unsqueeze(-2)  # (B, 1, m, m)
        middle = inverse_and_scaling(kernel_a * blocks, variant, solver, newton_iters,
                                     iterate, 1 - inside)
        return middle * blocks

    middles = [inverse_and_scaling(kernel_a[i:i + 1, :, :count, :count], variant,
                                   solver, newton_iters, iterate)
               for i, count in enumerate(token_counts)]  # (1, h, c, c) each
    return torch.cat([F.pad(middle, (0, tokens - middle.shape[-1]) * 2)
                      for middle in middles])


# --- Attention
def kernel_products(kernel: torch.Tensor, middle: torch.Tensor,
                    values: torch.Tensor) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``: K1 (B, h, N, m), middle (B, h, m, m) and V
    (B, h, N, d) -> (B, h, N, d), right to left in O(N m d)."""
    return kernel @ (middle @ (kernel.transpose(-1, -2) @ values))


def capped_grid_size(height: int, width: int,
                     max_tokens: Optional[int]) -> Tuple[int, int]:
    """The largest grid with the aspect of ``height x width`` and at most
    ``max_tokens`` cells."""
    if max_tokens is None or height * width <= max_tokens:
        return height, width

    scale = math.sqrt(max_tokens / (height * width))

    rows = min(height, max(1, math.floor(height * scale)))
    cols = min(width, max(1, math.floor(width * scale)))
    # Only a side clamped up to 1 can push the product over the cap.
    if rows == 1:
        cols = min(cols, max_tokens)
    if cols == 1:
        rows = min(rows, max_tokens)
    return rows, cols


def cap_bottleneck_grid(grid: torch.Tensor, max_tokens: Optional[int]) -> torch.Tensor:
    """A grid (B, d, h, w) average-pooled to at most ``max_tokens`` cells."""
    size = capped_grid_size(grid.shape[-2], grid.shape[-1], max_tokens)
    if size == tuple(grid.shape[-2:]):
        return grid
    return F.adaptive_avg_pool2d(grid, size)


def linear_to_map(x: torch.Tensor, layer: nn.Linear, hw_shape) -> torch.Tensor:
    """``layer`` on tokens (B, N, C_in) as ``W x^T + b``: an NCHW map (B, C_out, H, W)."""
    batch, tokens, _ = x.shape
    weight = layer.weight.expand(batch, -1, -1)  # (B, C_out, C_in)
    bias = layer.bias[:, None].expand(batch, -1, tokens)  # (B, C_out, N)
    return torch.baddbmm(bias, weight, x.transpose(1, 2)).view(batch, -1, *hw_shape)


class SoftAttention(nn.Module):
    """Softmax-free attention: ``proj(K1 . middle . (K1^T V) + DWConv(V))``.

    Queries double as keys, ``Q = d^-1/4 Q0``. The bottleneck tokens L come from
    a stride-``sr_ratio`` convolution shared by the heads, LayerNorm and GELU,
    average-pooled to at most ``max_bottleneck_tokens`` (None: no cap).
    ``kernel_chunk_tokens`` bounds the rows of K1 the memory-saving path holds."""

    def __init__(self, embed_dims: int, num_heads: int, sr_ratio: int,
                 local_kernel_size: int, variant: str = 'soft', solver: str = 'newton',
                 newton_iters: int = 20, max_bottleneck_tokens: Optional[int] = None,
                 kernel_chunk_tokens: Optional[int] = None):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by '
                             f'num_heads={num_heads}.')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.scale = self.head_dims**-0.25  # Q = scale * Q0
        self.variant = variant
        check_choice('variant', variant, VARIANTS)
        check_choice('solver', solver, SOLVERS)
        self.solver = solver
        self.newton_iters = newton_iters
        self.max_bottleneck_tokens = max_bottleneck_tokens
        self.kernel_chunk_tokens = kernel_chunk_tokens
        self.exportable = False

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.bottleneck_conv = nn.Conv2d(self.head_dims, self.head_dims, sr_ratio,
                                         stride=sr_ratio, bias=False)
        self.bottleneck_norm = nn.LayerNorm(self.head_dims)
        self.local_conv = nn.Conv2d(num_heads, num_heads, local_kernel_size,
                                    padding=local_kernel_size // 2, groups=num_heads,
                                    bias=False)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: torch.Tensor, hw_shape,
                regions: Optional[Regions] = None) -> torch.Tensor:
        """Tokens (B, N, C) on the (H, W) grid -> (B, N, C); each image attends
        within its region (outside it the outputs are meaningless)."""
        query_map, value_map = self.project(x, hw_shape, regions)  # (B, C, H, W)
        bottleneck, counts = self.bottleneck_tokens(query_map, regions)  # L: (B,h,m,d)
        queries, values = self.heads(query_map), self.heads(value_map)  # (B, h, N, d)

        with autocast_off(x.device.type):
            kernel = gaussian_kernel(self.scale * queries, bottleneck)  # K1: (B, h, N, m)
            kernel_a = gaussian_kernel(bottleneck, bottleneck,
                                       float32_products=True)  # A: (B, h, m, m)
            middle = middle_matrix(kernel_a, self.variant, self.solver_to_run(),
                                   self.newton_iters, token_counts=counts)
            out = kernel_products(kernel, middle, values)  # (B, h, N, d)
        return self.output(out, value_map)

    def project(self, x: torch.Tensor, hw_shape, regions: Optional[Regions]):
        """Q0 and V as NCHW maps (B, C, H, W), V zero outside the regions."""
        query_map = linear_to_map(x, self.q_proj, hw_shape)
        value_map = linear_to_map(x, self.v_proj, hw_shape)
        if regions is not None:
            value_map = value_map.masked_fill(regions.padding, 0.)
        return query_map, value_map

    def heads(self, feature_map: torch.Tensor) -> torch.Tensor:
        """A map (B, h * d, H, W) as heads of tokens (B, h, H * W, d), float32."""
        batch, channels = feature_map.shape[:2]
        heads = feature_map.reshape(batch, self.num_heads, channels // self.num_heads, -1)
        return full_precision(heads.transpose(-1, -2))

    def bottleneck_tokens(self, query_map: torch.Tensor,
                          regions: Optional[Regions] = None
                          ) -> Tuple[torch.Tensor, Optional[List[int]]]:
        """L (B, h, m, d) of the map of Q (B, h * d, H, W), and each image's count.

        With ``regions``, image i's tokens pool its region alone; they are the
        first c_i of the m, the others pad.
        """
        cap = traceable_cap_bottleneck_grid if self.exportable else cap_bottleneck_grid
        weight = self.bottleneck_conv.weight.repeat(self.num_heads, 1, 1, 1)
        stride = self.bottleneck_conv.stride[0]
        grid = F.conv2d(query_map, weight, stride=stride,
                        groups=self.num_heads)  # (B, h*d, H/r, W/r)
        counts = None
        if regions is None:
            tokens = cap(grid, self.max_bottleneck_tokens).flatten(2)  # (B, h*d, m)
        else:
            cells = [(height // stride, width // stride) for height, width in regions.shapes]
            if not all(rows and cols for rows, cols in cells):
                raise ValueError(
                    f'valid_shapes={regions.shapes} holds a region too small for the '
                    f'bottleneck convolution of stride {stride}; expected every region '
                    f'to span at least {stride} x {stride} cells of each grid.')
            pooled = [cap(grid[i:i + 1, :, :rows, :cols], self.max_bottleneck_tokens)
                      for i, (rows, cols) in enumerate(cells)]  # (1, h*d, h', w')
            counts = [part.shape[-2] * part.shape[-1] for part in pooled]
            tokens = torch.cat([F.pad(part.flatten(2), (0, max(counts) - count))
                                for part, count in zip(pooled, counts)])

        bottleneck = tokens.reshape(tokens.shape[0], self.num_heads, self.head_dims, -1)
        # LayerNorm's input and gradient contiguous, for the compiler's stride model.
        bottleneck = (bottleneck.transpose(-1, -2) * self.scale).contiguous()
        bottleneck = gelu(self.bottleneck_norm(bottleneck))  # (B, h, m, d)
        return full_precision(contiguous_gradient(bottleneck)), counts

    def solver_to_run(self) -> str:
        """The solver; in the ONNX formulation, the one ONNX can express."""
        if self.exportable:
            return EXPORT_SOLVERS.get(self.solver, self.solver)
        return self.solver

    def chunk_tokens(self, queries: torch.Tensor) -> int:
        """Rows of K1 the memory-saving path holds at a time (fewer on the CPU)."""
        tokens = queries.shape[-2]
        chunk = min(self.kernel_chunk_tokens or tokens, tokens)
        if chunk < tokens and queries.device.type == 'cpu':
            chunk = min(chunk, CPU_CHUNK_TOKENS)  # evaluated twice: where caches hold
        return chunk

    def output(self, out: torch.Tensor, value_map: torch.Tensor) -> torch.Tensor:
        """``proj(global + DWConv(V))`` from the global term (B, h, N, d)."""
        weight = self.local_conv.weight.repeat_interleave(self.head_dims, dim=0)
        local = F.conv2d(value_map, weight, padding=self.local_conv.padding,
                         groups=weight.shape[0])  # (B, C, H, W)

        out = merge_heads(out.to(local.dtype)) + local.flatten(2).transpose(1, 2)
        return self.out_proj(out)  # (B, N, C)


# --- Blocks
#: GELU with the tanh approximation, as SOFT's reference code.
TanhGELU = partial(nn.GELU, approximate='tanh')


class SoftBlock(nn.Module):
    """Post-norm ``x = LN(x + attn(x)); x = LN(x + MLP(x))`` with SOFT attention
    (``attn_kwargs``: :class:`SoftAttention`'s)."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int, sr_ratio: int,
                 local_kernel_size: int, mlp_ratio: float = 4., drop_path: float = 0.,
                 **attn_kwargs):
        super().__init__()
        self.attn = SoftAttention(embed_dims, num_heads, sr_ratio, local_kernel_size,
                                  **attn_kwargs)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio), act_layer=TanhGELU)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor, hw_shape,
                regions: Optional[Regions] = None) -> torch.Tensor:
        """(B, N, C) on the (H, W) grid -> (B, N, C)."""
        if self.memory_efficient and torch.is_grad_enabled() and not is_tracing():
            return self.twin(self, x, hw_shape, regions)  # memory_efficient.soft_block
        x = self.norm1(x + self.drop_path(self.attn(x, hw_shape, regions)))
        return self.norm2(x + self.drop_path(self.mlp(x)))


class GlobalSoftmaxAttention(nn.Module):
    """Multi-head softmax attention over all tokens; ``qkv_bias``: projection bias."""

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
        """(B, N, C) -> (B, N, C); ``key_mask`` (B, N) bool is False for padding."""
        queries = split_heads(self.q(x), self.num_heads)  # (B, h, N, d)
        keys, values = (split_heads(t, self.num_heads) for t in self.kv(x).chunk(2, -1))
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask)
        return self.proj(merge_heads(out))


def grid_key_mask(x: torch.Tensor, regions: Optional[Regions]) -> Optional[torch.Tensor]:
    """(B, N) bool: True for the leading extra tokens and the grid tokens inside
    the regions; None without regions."""
    if regions is None:
        return None
    inside = ~regions.padding.flatten(1)  # (B, H * W)
    extra = inside.new_ones(x.shape[0], x.shape[1] - inside.shape[1])
    return torch.cat((extra, inside), dim=1)


class SoftmaxBlock(nn.Module):
    """Pre-norm ``x = x + attn(LN(x)); x = x + MLP(LN(x))`` with softmax attention."""

    memory_efficient = True

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 drop_path: float = 0., qkv_bias: bool = True, norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = GlobalSoftmaxAttention(embed_dims, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mlp = MLP(embed_dims, int(embed_dims * mlp_ratio))
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: torch.Tensor, hw_shape=None,
                regions: Optional[Regions] = None) -> torch.Tensor:
        """(B, extra + H * W, C) -> the same; grid tokens outside the regions are
        no keys."""
        if self.memory_efficient and torch.is_grad_enabled() and not is_tracing():
            return self.twin(self, x, hw_shape, regions)  # memory_efficient.softmax_block
        x = x + self.drop_path(self.attn(self.norm1(x), grid_key_mask(x, regions)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


# --- Position embeddings
def interpolate_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                          dst_shape: Tuple[int, int]) -> torch.Tensor:
    """Position embeddings (1, Hs * Ws, C) resampled bilinearly to (1, H * W, C)."""
    grid = pos_embed.reshape(1, *src_shape, pos_embed.shape[-1]).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_shape, mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                     dst_shape: Tuple[int, int]) -> torch.Tensor:
    """:func:`interpolate_pos_embed`, or ``pos_embed`` itself at its own size."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    return interpolate_pos_embed(pos_embed, src_shape, dst_shape)


def resize_pos_embed_to_regions(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                                hw_shape: Tuple[int, int],
                                valid_shapes: ValidShapes) -> torch.Tensor:
    """Embeddings (1, Hs * Ws, C) resized to each region: (B, H * W, C), zero outside."""
    resized = per_distinct_shape(  # (1, h * w, C) each
        lambda shape: resize_pos_embed(pos_embed, src_shape, shape), valid_shapes)
    grids = [resized[shape].unflatten(1, shape).movedim(-1, 1)  # (1, C, h, w)
             for shape in valid_shapes]
    return torch.cat([pad_to_grid(grid, hw_shape) for grid in grids]).flatten(2).transpose(1, 2)


# --- Stage
class SoftStage(nn.Module):
    """One stage: patch embedding, position embeddings learned on ``pos_grid``
    and resized to each grid, blocks, and with ``class_token`` (the last
    stage) a class token and a final LayerNorm."""

    def __init__(self, patch_embed: ConvPatchEmbed, blocks: Sequence[nn.Module],
                 embed_dims: int, pos_grid: Tuple[int, int], class_token: bool = False,
                 drop_rate: float = 0.):
        super().__init__()
        self.patch_embed = patch_embed
        self.pos_grid = tuple(pos_grid)
        self.extra_tokens = int(class_token)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.extra_tokens + math.prod(pos_grid), embed_dims))
        if class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)

        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(embed_dims, eps=1e-6) if class_token else nn.Identity()
        self.grad_checkpointing = False
        self.exportable = False

    def forward(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int], Optional[Regions]]:
        """A map (B, C_in, H_in, W_in) -> tokens (B, extra + H * W, C), the grid
        (H, W) and its regions; padded cells of the input are ignored."""
        patches, hw_shape = self.patch_embed(x, valid_shapes)  # (B, N, C)
        if valid_shapes is not None:
            valid_shapes = self.patch_embed.output_shapes(valid_shapes)
        regions = regions_on_grid(valid_shapes, hw_shape, patches.device)

        if self.extra_tokens:
            cls_token = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, C)
            patches = torch.cat((cls_token, patches), dim=1)
        tokens = self.pos_drop(patches + self.position_embeddings(hw_shape, valid_shapes))

        for block in self.blocks:
            if self.grad_checkpointing and self.training and tokens.requires_grad:
                tokens = recomputed(block, tokens, hw_shape, regions)
            else:
                tokens = block(tokens, hw_shape, regions)
        return self.norm(tokens), hw_shape, regions

    def position_embeddings(self, hw_shape: Tuple[int, int],
                            valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """The embeddings at ``hw_shape`` (per region), class token's first:
        (1 or B, extra + H * W, C). The ONNX formulation resizes every grid."""
        grid_embed = self.pos_embed[:, self.extra_tokens:]
        if valid_shapes is not None:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grid, hw_shape,
                                               valid_shapes)
        elif self.exportable:
            grid = interpolate_pos_embed(grid_embed, self.pos_grid, hw_shape)
        else:
            grid = resize_pos_embed(grid_embed, self.pos_grid, hw_shape)
        if not self.extra_tokens:
            return grid

        extra_embed = self.pos_embed[:, :self.extra_tokens].expand(grid.shape[0], -1, -1)
        return torch.cat((extra_embed, grid), dim=1)


# --- Model
ARCH_SETTINGS = {
    'tiny': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                 depths=[1, 2, 3, 2]),
    # The reference code's depths, so that its checkpoints load.
    'small': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 20, 4]),
    'medium': dict(embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16],
                   depths=[1, 3, 29, 5]),
    'large': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 40, 5]),
    'huge': dict(embed_dims=[64, 128, 352, 512], num_heads=[2, 4, 11, 16],
                 depths=[1, 5, 49, 5]),
}
ARCH_DEFAULTS = dict(sr_ratios=[8, 4, 2, 1], local_kernel_sizes=[9, 5, 3],
                     mlp_ratios=[4, 4, 4, 4], stem_channels=32)
NUM_STAGES = 4
#: The stage of tokens ``[cls; grid]``.
CLASS_TOKEN_STAGE = NUM_STAGES - 1


class SOFT(DenseBackbone):
    """SOFT / SOFT++ (Lu et al., NeurIPS 2021 / IJCV 2024).

    Four :class:`SoftStage` s at strides 4-32: stages 1-3 run :class:`SoftBlock` s,
    stage 4 :class:`SoftmaxBlock` s with a class token, whose normalised state
    feeds the classifier ``head``.

    Args:
        arch (str | dict): ``'tiny'`` to ``'huge'``, or a dict of ``embed_dims``,
            ``num_heads``, ``depths`` (and ``ARCH_DEFAULTS``' keys).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
        max_bottleneck_tokens (int, optional): The bottleneck cap; None: none.
        kernel_chunk_tokens (int, optional): Rows of K1 the memory-saving path
            holds at a time; None: all.
        pretrain_img_size (int): The position embeddings' image size.
        memory_efficient (bool): Train through the memory-saving twins.
        recompute_mlp (bool): The MLPs recompute their hidden layer too.
        global_pool (str): ``'token'`` (the class token) or ``''``."""

    family = 'SOFT'

    def __init__(self, arch: Union[str, dict] = 'tiny', variant: str = 'soft++',
                 solver: str = 'newton', newton_iters: int = 20,
                 max_bottleneck_tokens: Optional[int] = 256,
                 kernel_chunk_tokens: Optional[int] = 16384, in_channels: int = 3,
                 pretrain_img_size: int = 224, out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_rate: float = 0., drop_path_rate: float = 0.1,
                 memory_efficient: bool = True, recompute_mlp: bool = False,
                 num_classes: int = 0, global_pool: str = 'token'):
        super().__init__(in_channels, out_indices, num_classes, global_pool, drop_rate,
                         drop_path_rate)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'num_heads', 'depths'), ARCH_DEFAULTS)
        check_lengths(settings, ('embed_dims', 'num_heads', 'depths', 'sr_ratios',
                                 'mlp_ratios'), NUM_STAGES)
        check_lengths(settings, ('local_kernel_sizes', ), NUM_STAGES - 1)
        check_divisible('embed_dims', settings['embed_dims'], 'num_heads',
                        settings['num_heads'])
        check_choice('variant', variant, VARIANTS)
        check_choice('solver', solver, SOLVERS)
        check_positive_int('newton_iters', newton_iters)
        check_positive_int('max_bottleneck_tokens', max_bottleneck_tokens, allow_none=True)
        check_positive_int('kernel_chunk_tokens', kernel_chunk_tokens, allow_none=True)
        check_positive_int('pretrain_img_size', pretrain_img_size)

        self.arch_settings = settings
        self.variant = variant
        self.solver = solver
        self.embed_dims = list(settings['embed_dims'])
        self.num_features = self.head_hidden_size = self.embed_dims[-1]
        self.feature_info = [dict(num_chs=dims, reduction=2**(i + 2), module=f'stages.{i}')
                             for i, dims in enumerate(self.embed_dims)]

        depths = settings['depths']
        rates = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()
        attn_kwargs = dict(variant=variant, solver=solver, newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        patch_embeds = [self._patch_embed(i) for i in range(NUM_STAGES)]
        self.stages = nn.ModuleList()
        for i, dims in enumerate(self.embed_dims):
            stage_rates = rates[sum(depths[:i]):sum(depths[:i + 1])]
            blocks = [self._block(i, rate, attn_kwargs) for rate in stage_rates]
            pos_grid = (pretrain_img_size // 2**(i + 2), ) * 2
            self.stages.append(SoftStage(patch_embeds[i], blocks, dims, pos_grid,
                                         class_token=i == CLASS_TOKEN_STAGE,
                                         drop_rate=drop_rate))
        self.head = self._classifier(num_classes)
        self.select_memory_path(memory_efficient, recompute_mlp)
        self._init_from_scratch()

    def _patch_embed(self, stage: int) -> ConvPatchEmbed:
        """Stage 1: three convolutions (strides 2, 1, 2); later stages one of stride 2."""
        dims = self.embed_dims[stage]
        if stage == 0:
            stem = self.arch_settings['stem_channels']
            return ConvPatchEmbed([self.in_channels, stem, stem, dims], [2, 1, 2])
        return ConvPatchEmbed([self.embed_dims[stage - 1], dims], [2])

    def _block(self, stage: int, drop_path: float, attn_kwargs: dict) -> nn.Module:
        settings = self.arch_settings
        dims, heads = self.embed_dims[stage], settings['num_heads'][stage]
        mlp_ratio = settings['mlp_ratios'][stage]
        if stage == NUM_STAGES - 1:
            return SoftmaxBlock(dims, heads, mlp_ratio, drop_path)
        return SoftBlock(dims, heads, settings['sr_ratios'][stage],
                         settings['local_kernel_sizes'][stage], mlp_ratio, drop_path,
                         **attn_kwargs)

    def _init_from_scratch(self) -> None:
        """Truncated-normal position embeddings, class token and Linear weights."""
        for name, param in self.named_parameters():
            if name.endswith(('.pos_embed', '.cls_token')):
                nn.init.trunc_normal_(param, std=.02)
        self.apply(init_transformer_weights)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised stage-4 tokens, class token first: (B, 1 + N, C)."""
        self.check_input(x)
        for stage in self.stages:
            tokens, hw_shape, _ = stage(x)
            x = tokens_as_map(tokens[:, stage.extra_tokens:], hw_shape)  # a view
        return tokens

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, 1 + N, C) -> logits (B, num_classes), or features (B, C)."""
        if self.global_pool == 'token':
            x = x[:, 0]
        return x if pre_logits else self.head(x)

    def forward_intermediates(self, x: torch.Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW', intermediates_only: bool = False,
                              valid_shapes: Optional[Sequence] = None):
        """timm's feature API: the NCHW maps of ``indices`` (strides 4-32) in one
        pass, zero outside ``valid_shapes`` (each image's (h, w) in a padded
        batch); with ``intermediates_only`` (or ``stop_early``) it stops after the
        last stage asked for. Returns the maps, or the last tokens and the maps."""
        valid_shapes, indices = self.intermediates_request(x, indices, output_fmt,
                                                           valid_shapes)

        last = max(indices) if stop_early or intermediates_only else NUM_STAGES - 1
        maps = []
        for i, stage in enumerate(self.stages[:last + 1]):
            tokens, hw_shape, regions = stage(x, valid_shapes)
            grid = tokens[:, stage.extra_tokens:]  # (B, N, C)
            if i in indices:  # contiguous NCHW, zero outside the regions
                feature = tokens_to_map(grid, hw_shape)
                if regions is not None:
                    feature = feature.masked_fill(regions.padding, 0.)
                maps.append(feature)
            x = tokens_as_map(grid, hw_shape)  # the next stage's input, a view
            valid_shapes = None if regions is None else regions.shapes
        return maps if intermediates_only else (tokens, maps)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new classifier of ``num_classes`` outputs (0: none)."""
        self.num_classes = num_classes
        if global_pool is not None:
            check_choice('global_pool', global_pool, ('token', ''))
            self.global_pool = global_pool
        self.head = self._classifier(num_classes)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drops the stages after the last of ``indices`` and (``prune_head``)
        the classifier; returns the kept indices."""
        kept = take_indices(indices, len(self.stages))
        del self.stages[max(kept) + 1:]
        self.feature_info = self.feature_info[:max(kept) + 1]
        if prune_head:
            self.reset_classifier(0, '')
        return kept

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {name for name, _ in self.named_parameters()
                if name.endswith(('.pos_embed', '.cls_token'))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r'^stages\.0\.(?:patch_embed|pos_embed)',
                    blocks=r'^stages\.(\d+)' if coarse else
                    [(r'^stages\.(\d+)\.blocks\.(\d+)', None), (r'^stages\.(\d+)\.', None)])


def set_exportable(model: nn.Module, enabled: bool) -> nn.Module:
    """Switches the ONNX formulation of every SOFT layer; returns ``model``."""
    if not isinstance(enabled, bool):
        raise ValueError(f'enabled={enabled!r} is invalid; expected True or False.')
    for module in model.modules():
        if isinstance(module, (SoftAttention, SoftStage)):
            module.exportable = enabled
    return model


def checkpoint_filter_fn(state_dict: dict, model: SOFT) -> dict:
    """An official SOFT / SOFT++ checkpoint (fudan-zvg/SOFT) in :class:`SOFT`'s
    layout; one in mmsoft's layout (or an earlier one) passes as it is.
    ``head.*`` is kept where ``model`` has a classifier."""
    if {'stages.0.patch_embed.proj.0.weight', 'patch_embeds.0.proj.0.weight'} & set(state_dict):
        return state_dict
    converted, _ = soft_official_to_mmsoft(state_dict, variant=model.variant)
    if isinstance(model.head, nn.Linear):
        converted.update({key: state_dict[key] for key in ('head.weight', 'head.bias')})
    return converted
