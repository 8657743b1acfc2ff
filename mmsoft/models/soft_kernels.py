"""SOFT attention's kernel math, from the attention down to the products.

The low-rank term ``K1 . middle . (K1^T V)`` (plain and memory-saving), the
kernel inverse ``middle``: ``'soft'``: ``(A + 0.01 I)^-1``; ``'soft++'``:
``pinv(A)``, with ``A = k(L, L)`` the Gaussian kernel of the bottleneck tokens L.
Its solvers: ``'newton'`` (iteration ``V <- 2V - V P V``), ``'newton_closed_form'``
(the same iterate from one ``eigh``) and ``'exact'``. Then the Gaussian kernel,
float32-accurate matmuls under TF32 and the memory-saving autograd functions.
"""
from itertools import islice
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from ..deprecations import renamed_solver
from ..utils.torch_compat import autocast_off, is_compiling
from ..utils.validation import check_choice
from .functional import (apply_without_autocast, backward_without_autocast,
                         full_precision)

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'newton_closed_form', 'exact')
#: The solver an ONNX graph computes for each solver that ONNX can express.
EXPORT_SOLVERS = {'newton': 'newton', 'newton_closed_form': 'newton'}
#: The dtype of the closed form's eigendecomposition.
EIGH_DTYPE = torch.float64
#: Device types where ``'newton_closed_form'`` uses ``eigh``; elsewhere it iterates.
CLOSED_FORM_DEVICES = ('cpu', )
#: SOFT++ takes the pseudo-inverse of at least this many bottleneck tokens.
MIN_PSEUDO_INVERSE_TOKENS = 3
#: Tokens per slice of the chunked product's N x m temporaries in backward
#: on the CPU (a cache's size); a GPU takes a whole chunk at a time.
BACKWARD_CHUNK = 1024
#: Most tokens per chunk of the chunked product on the CPU, where it
#: chunks at all: a chunk's (B, h, c, m) kernel stays in the caches from its
#: product to its use.
CPU_CHUNK_TOKENS = 512
#: A Newton iteration ``iterate(P, alpha, k) -> V_k``.
NewtonIterations = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


# --- The low-rank term of SOFT attention, plain and memory-saving
def low_rank_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                              values: torch.Tensor, variant: str, solver: str,
                              newton_iters: int,
                              query_scale: float = 1.) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``: the low-rank part of SOFT attention; its
    memory-saving twin is :func:`memory_efficient_kernel_attention`.

    ``K1 = k(Q, L)``, ``A = k(L, L)``; ``middle = (A + 0.01 I)^-1`` (``'soft'``) or
    ``D^-1/2 pinv(A) D^-1/2`` with ``D = diag(A 1)`` (``'soft++'``).

    Args:
        queries (Tensor): Unscaled queries Q0 (= keys), shape (B, h, N, d).
        bottleneck (Tensor): Bottleneck tokens L, shape (B, h, m, d).
        values (Tensor): Values V, shape (B, h, N, d).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
        newton_iters (int): Newton iterations.
        query_scale (float): ``Q = query_scale * Q0``. Default: 1.

    Returns:
        Tensor: Shape (B, h, N, d).
    """
    middle = middle_matrix(bottleneck, variant, solver, newton_iters)  # (B, h, m, m)
    query_kernel = gaussian_kernel(queries * query_scale, bottleneck)  # K1: (B,h,N,m)
    summary = query_kernel.transpose(-1, -2) @ values  # K1^T V: (B, h, m, d)
    return query_kernel @ (middle @ summary)  # (B, h, N, d)


def memory_efficient_kernel_attention(queries: torch.Tensor, bottleneck: torch.Tensor,
                                      values: torch.Tensor, variant: str, solver: str,
                                      newton_iters: int, query_scale: float = 1.,
                                      chunk_tokens: Optional[int] = None
                                      ) -> torch.Tensor:
    """``K1 . middle . K1^T V``, keeping neither kernel nor Newton iterates.

    ``middle`` inverts ``A = k(L, L)``; ``'soft++'``: ``D^-1/2 pinv(A) D^-1/2``.

    Args:
        queries (Tensor): Q0, (B, h, N, d); ``Q = query_scale * Q0``.
        bottleneck (Tensor): L, (B, h, m, d).
        values (Tensor): V, (B, h, N, d).
        chunk_tokens (int, optional): Most rows of K1 at a time. Default: all.

    Returns:
        Tensor: (B, h, N, d).
    """
    middle = middle_matrix(bottleneck, variant, solver, newton_iters,
                           recomputed_newton_iterations)  # (B, h, m, m)
    tokens = queries.shape[-2]
    chunk = tokens if chunk_tokens is None else min(chunk_tokens, tokens)
    if chunk < tokens and queries.device.type == 'cpu':
        # Evaluated twice anyway: in chunks the caches hold.
        chunk = min(chunk, CPU_CHUNK_TOKENS)
    return chunked_kernel_product(queries, bottleneck, middle, values, chunk,
                                  query_scale)


def middle_matrix(bottleneck: torch.Tensor, variant: str, solver: str,
                  newton_iters: int,
                  iterate: Optional[NewtonIterations] = None) -> torch.Tensor:
    """``middle = (A + 0.01 I)^-1`` (``'soft'``) or ``D^-1/2 pinv(A) D^-1/2``
    (``'soft++'``), ``A = k(L, L)``, ``D = diag(A 1)``: L (B, h, m, d) ->
    (B, h, m, m); ``iterate`` as :func:`kernel_inverse`'s."""
    kernel_a = bottleneck_kernel(bottleneck)  # A: (B, h, m, m)
    middle = kernel_inverse(kernel_a, variant, solver, newton_iters, iterate)
    if variant == 'soft++':
        middle = scaled_both_sides(middle, kernel_a.sum(-1).rsqrt())
    return middle


# --- Kernel inverse
def kernel_inverse(mat: torch.Tensor, variant: str = 'soft', solver: str = 'newton',
                   num_iters: int = 20,
                   iterate: Optional[NewtonIterations] = None) -> torch.Tensor:
    """Differentiable ``(A + 0.01 I)^-1`` (``'soft'``) or ``pinv(A)`` (``'soft++'``).

    Args:
        mat (Tensor): Symmetric A, (B, ..., m, m); B indexes images.
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft'``.
        solver (str): One of :data:`SOLVERS`, run as :func:`solver_that_runs`
            says on ``mat``'s device. Default: ``'newton'``.
        num_iters (int): Newton steps. Default: 20.
        iterate (callable, optional): The Newton iteration: :func:`newton_iterations`
            (None) or :func:`recomputed_newton_iterations`, which keeps only P.

    Returns:
        Tensor: (B, ..., m, m); float32 for half or bfloat16 ``mat``, else its dtype.
    """
    solver = solver_that_runs(solver, mat.device.type)
    variant = inverse_formula(variant, mat.shape[-1])
    with autocast_off(mat.device.type):
        mat = full_precision(mat)
        if solver == 'exact':
            return _ExactInverse.apply(mat, variant)
        with torch.no_grad():
            alpha = newton_scale(mat, variant)  # a step size: (B, ..., 1, 1)
        operand = newton_operand(mat, variant)  # P: (B, ..., m, m)
        if solver == 'newton_closed_form':
            return newton_closed_form(operand, alpha, num_iters)
        return (iterate or newton_iterations)(operand, alpha, num_iters)


def solver_that_runs(solver: str, device_type: str) -> str:
    """The solver run for ``solver`` on ``device_type``."""
    if solver == 'newton_closed_form' and device_type not in CLOSED_FORM_DEVICES:
        return 'newton'
    return solver


def check_kernel_inverse_options(variant: str, solver: str) -> str:
    """Validates ``variant`` and ``solver``.

    Returns:
        str: The solver's name in :data:`SOLVERS`.

    Raises:
        ValueError: If either is not accepted.
    """
    check_choice('variant', variant, VARIANTS)
    solver = renamed_solver(solver)
    check_choice('solver', solver, SOLVERS)
    return solver


def inverse_formula(variant: str, tokens: int) -> str:
    """``variant``'s inverse of m tokens: ``'soft'`` also for ``'soft++'``, m < 3."""
    if variant == 'soft++' and tokens < MIN_PSEUDO_INVERSE_TOKENS:
        return 'soft'
    return variant


def scaled_both_sides(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(scale) . mat . diag(scale)``: (..., m, m)."""
    return scale.unsqueeze(-1) * mat * scale.unsqueeze(-2)


def _eye_like(mat: torch.Tensor) -> torch.Tensor:
    return torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)


def _per_image_max(values: torch.Tensor) -> torch.Tensor:
    """Max over all but the first dim: (B, ...) -> (B, 1, ..., 1)."""
    if values.dim() <= 1:
        return values.amax().reshape(*([1] * (values.dim() + 1)))
    peak = values.flatten(1).amax(1)  # (B, )
    return peak.reshape(-1, *([1] * values.dim()))


# --- Newton operand and starting scale
def newton_operand(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """P: ``A + 0.01 I`` for ``'soft'``, ``A`` for ``'soft++'``; (..., m, m)."""
    if variant == 'soft':
        return mat + REGULARISER * _eye_like(mat)
    return mat


def regularised_newton_scale(mat: torch.Tensor) -> torch.Tensor:
    """SOFT's ``alpha = 0.9 * 2 / (max row sum of A)^2``: (..., 1, 1)."""
    max_row_sum = mat.sum(-1).amax(-1)  # (...)
    return (0.9 * 2 / max_row_sum.pow(2))[..., None, None]


def pseudo_inverse_newton_scale(mat: torch.Tensor,
                                max_halvings: int = 10) -> torch.Tensor:
    """SOFT++'s ``alpha = 2 / (max row sum)^2``, per image (B, 1, ..., 1, 1).

    Halved while ``max colsum |I - alpha A^2| > 1.01``, at most ``max_halvings``
    times. A's entries are non-negative (a Gaussian kernel), so are those of
    ``S = A^2``, and column j's sum is ``|1 - alpha S_jj| + alpha (c_j - S_jj)``
    with ``c = A (A 1)`` and ``S_jj = sum_k A_jk^2``: no m x m product is formed.
    Every halving is tested at once: the loop halves as many times as the
    leading candidates ``alpha / 2^i`` fail.
    """
    row_sums = mat.sum(-1)  # A 1: (B, ..., m)
    column_sums = (mat @ row_sums.unsqueeze(-1)).squeeze(-1)  # c: (B, ..., m)
    diagonal = mat.pow(2).sum(-1)  # S_jj: (B, ..., m)
    alpha = 2 / _per_image_max(row_sums).pow(2)  # (B, 1, ..., 1)

    halvings = torch.arange(max_halvings, device=mat.device, dtype=mat.dtype)
    shape = (max_halvings, ) + (1, ) * diagonal.dim()
    step = alpha.squeeze(-1) * torch.pow(0.5, halvings).view(shape)  # (k, B, 1.., 1)
    residual = (1 - step * diagonal).abs() + step * (column_sums - diagonal)
    images = alpha.shape[0] if mat.dim() > 2 else 1
    too_large = residual.reshape(max_halvings, images, -1).amax(-1) > 1.01  # (k, B)
    count = too_large.to(mat.dtype).cumprod(0).sum(0)  # leading failures: (B, )
    return alpha * torch.pow(0.5, count).view(alpha.shape)


def newton_scale(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """The starting scale ``alpha`` (``V_0 = alpha P``) of ``variant``."""
    if variant == 'soft':
        return regularised_newton_scale(mat)
    return pseudo_inverse_newton_scale(mat)


# --- Newton iteration, plain and recomputed in backward
def newton_iterates(operand: torch.Tensor, alpha: torch.Tensor, num_iters: int
                    ) -> Iterator[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Lazily yields ``(V_j, V_j P)`` for ``j < k``, then ``(V_k, None)``.

    P (n, m, m) and alpha (n, 1, 1); each step ``V <- 2V - (V P) V`` is two
    products, the second with the update folded in (``matmul_add``).
    """
    inverse = alpha * operand  # V_0
    for _ in range(num_iters):
        product = float32_matmul(inverse, operand)  # V_j P
        yield inverse, product
        inverse = matmul_add(inverse, product, inverse, beta=2, alpha=-1)  # V_{j+1}
    yield inverse, None


def as_matrix_batch(operand: torch.Tensor, alpha: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
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
                               num_iters: int,
                               grad_output: torch.Tensor) -> torch.Tensor:
    """``dL/dP`` of ``V_k = newton_iterations(P, alpha, k)``; ``G = dL/dV_k``.

    With ``W = G_{j+1} V_j^T``: ``G_j = 2 G_{j+1} - W P^T - (V_j P)^T G_{j+1}``,
    ``dL/dP = alpha G_0 - sum_j V_j^T W``.
    """
    matrices, alpha = as_matrix_batch(operand, alpha)  # (n, m, m), (n, 1, 1)
    # (V_j, V_j P) for j < k; V_k itself is not computed.
    steps = list(islice(newton_iterates(matrices, alpha, num_iters), num_iters))
    grad = grad_output.reshape(matrices.shape)  # G_k
    grad_operand = torch.zeros_like(matrices)
    operand_t = matrices.transpose(-1, -2)
    for inverse, product in reversed(steps):
        weighted = float32_matmul(grad, inverse.transpose(-1, -2))  # W: (n, m, m)
        grad_operand = matmul_add(grad_operand, inverse.transpose(-1, -2), weighted,
                                  alpha=-1)
        grad = matmul_add(matmul_add(grad, weighted, operand_t, beta=2, alpha=-1),
                          product.transpose(-1, -2), grad, alpha=-1)  # G_j
    return torch.addcmul(grad_operand, alpha, grad).view(operand.shape)


class _NewtonIterations(torch.autograd.Function):
    """``V_k(P)`` keeping only P and alpha; backward recomputes the iterates."""

    @staticmethod
    def forward(ctx, operand, alpha, num_iters):
        ctx.save_for_backward(operand, alpha)
        ctx.num_iters = num_iters
        return newton_iterations(operand, alpha, num_iters)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        operand, alpha = ctx.saved_tensors
        return (newton_iterations_backward(operand, alpha, ctx.num_iters,
                                           grad_output), None, None)


def recomputed_newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                                 num_iters: int) -> torch.Tensor:
    """:func:`newton_iterations` keeping only P for backward: (..., m, m)."""
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonIterations, operand, alpha, num_iters)


# --- Newton closed form on eigenvalues
def newton_on_eigenvalues(eigvals: torch.Tensor, alpha: torch.Tensor,
                          num_iters: int) -> torch.Tensor:
    """``g_k(l) = (1 - (1 - alpha l^2)^(2^k)) / l``, as ``v <- v (2 - l v)``."""
    value = alpha * eigvals
    for _ in range(num_iters):
        value = value * (2 - eigvals * value)
    return value


def newton_divided_difference_pairs(larger: torch.Tensor, smaller: torch.Tensor,
                                    alpha: torch.Tensor,
                                    num_iters: int) -> torch.Tensor:
    """``(g_k(a) - g_k(b)) / (a - b)`` for ``a >= b`` (``g_k'(a)`` at ``a = b``).

    By ``D <- D (2 - b (v_a + v_b)) - v_a^2`` from ``D_0 = alpha``.
    """
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
    slopes = newton_divided_difference_pairs(  # g_k'(lambda): (..., m)
        eigvals, eigvals, alpha.expand_as(eigvals), num_iters)
    row, col = eigvals.unsqueeze(-1), eigvals.unsqueeze(-2)  # (..., m, 1), (..., 1, m)
    gap = row - col  # (..., m, m)
    relative_gap = gap.abs() / torch.maximum(row.abs(), col.abs())  # NaN at 0 - 0
    is_equal = ~(relative_gap > 1e-5 / 2**(num_iters + 1))  # diagonal included
    is_close = ~(relative_gap > close)
    diff = torch.where(
        is_equal, 0.5 * (slopes.unsqueeze(-1) + slopes.unsqueeze(-2)),
        (values.unsqueeze(-1) - values.unsqueeze(-2))
        / torch.where(is_close, torch.ones_like(gap), gap))
    # The recursion on one triangle's pairs, mirrored to the other.
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


def spectral_apply(eigvecs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Q diag(w) Q^T``: Q (..., m, m), w (..., m)."""
    return (eigvecs * weights.unsqueeze(-2)) @ eigvecs.transpose(-1, -2)


class _NewtonClosedForm(torch.autograd.Function):
    """``V_k = Q diag(g_k(lambda)) Q^T`` from one ``eigh`` of P.

    Backward: ``dL/dP = Q (D o (Q^T G Q)) Q^T``, D the divided differences of g_k.
    """

    @staticmethod
    def forward(ctx, operand, alpha, num_iters):
        dtype = operand.dtype
        eigvals, eigvecs = torch.linalg.eigh(
            operand.to(EIGH_DTYPE))  # (..., m), (..., m, m)
        alpha = alpha.squeeze(-1).to(EIGH_DTYPE)  # (..., 1)
        weights = newton_on_eigenvalues(eigvals, alpha, num_iters)  # (..., m)
        eigvecs = eigvecs.to(dtype)
        ctx.save_for_backward(eigvals, eigvecs, alpha)
        ctx.num_iters = num_iters
        return spectral_apply(eigvecs, weights.to(dtype))

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        eigvals, eigvecs, alpha = ctx.saved_tensors
        diff = newton_divided_differences(eigvals, alpha, ctx.num_iters)
        inner = eigvecs.transpose(-1, -2) @ grad_output @ eigvecs  # (..., m, m)
        grad = eigvecs @ (diff.to(inner.dtype) * inner) @ eigvecs.transpose(-1, -2)
        return grad, None, None


def newton_closed_form(operand: torch.Tensor, alpha: torch.Tensor,
                       num_iters: int) -> torch.Tensor:
    """``V_k`` of :func:`newton_iterations` for symmetric P, from one ``eigh``.

    ``V_k = Q diag((1 - (1 - alpha lambda^2)^(2^k)) / lambda) Q^T``.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales, (..., 1, 1); a constant.
        num_iters (int): Steps k.

    Returns:
        Tensor: (..., m, m).
    """
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonClosedForm, operand, alpha, num_iters)


# --- Exact solvers
def cholesky_regularised_inverse(mat: torch.Tensor) -> torch.Tensor:
    """Exact ``(A + 0.01 I)^-1`` by Cholesky: (..., m, m) -> (..., m, m)."""
    factor = torch.linalg.cholesky(newton_operand(mat, 'soft'))
    return torch.cholesky_inverse(factor)


def eigh_pseudo_inverse(mat: torch.Tensor, rtol: float = None) -> torch.Tensor:
    """Exact ``pinv(A)`` of symmetric A (..., m, m); ``rtol`` as ``linalg.pinv``."""
    return torch.linalg.pinv(mat, rtol=rtol, hermitian=True)


def exact_inverse(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """``(A + 0.01 I)^-1`` (``'soft'``) or ``pinv(A)`` (``'soft++'``)."""
    if variant == 'soft':
        return cholesky_regularised_inverse(mat)
    return eigh_pseudo_inverse(mat)


class _ExactInverse(torch.autograd.Function):
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
        inverse, = ctx.saved_tensors
        inverse_t = inverse.transpose(-1, -2)
        grad_mat = -(inverse_t @ grad_output @ inverse_t)
        return grad_mat, None


# --- Gaussian kernel
def kernel_operands(x: torch.Tensor, y: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Operands whose product is the Gaussian kernel's exponent:
    ``[x, -|x|^2 / 2, 1] . [y, 1, -|y|^2 / 2]^T = x.y - |x|^2 / 2 - |y|^2 / 2``.

    Args:
        x (Tensor): Shape (..., N, d).
        y (Tensor): Shape (..., M, d).

    Returns:
        tuple[Tensor, Tensor]: Shapes (..., N, d + 2) and (..., M, d + 2).
    """
    left = torch.cat((x, -0.5 * x.pow(2).sum(-1, keepdim=True),
                      torch.ones_like(x[..., :1])), -1)
    right = torch.cat((y, torch.ones_like(y[..., :1]),
                       -0.5 * y.pow(2).sum(-1, keepdim=True)), -1)
    return left, right


def kernel_of_operands(left: torch.Tensor, right: torch.Tensor,
                       float32_products: bool = False) -> torch.Tensor:
    """``exp(left . right^T)``: one product and an exp in place, (..., N, M).

    Args:
        left (Tensor): (..., N, d + 2), see :func:`kernel_operands`.
        right (Tensor): (..., M, d + 2).
        float32_products (bool): The product by :func:`float32_matmul`.
            Default: False.
    """
    right_t = right.transpose(-1, -2)  # (..., d + 2, M)
    exponent = (float32_matmul(left, right_t) if float32_products
                else torch.matmul(left, right_t))  # (..., N, M)
    return exponent.exp_()


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor,
                    float32_products: bool = False) -> torch.Tensor:
    """Pairwise Gaussian kernel ``exp(x.y - ||x||^2 / 2 - ||y||^2 / 2)``.

    Args:
        x (Tensor): Shape (..., N, d).
        y (Tensor): Shape (..., M, d).
        float32_products (bool): The exponent by :func:`float32_matmul`.
            Default: False.

    Returns:
        Tensor: Shape (..., N, M).
    """
    return kernel_of_operands(*kernel_operands(x, y), float32_products)


def bottleneck_kernel(bottleneck: torch.Tensor) -> torch.Tensor:
    """``A = k(L, L)``: L (..., m, d) -> (..., m, m), float32-accurate."""
    return gaussian_kernel(bottleneck, bottleneck, float32_products=True)


# --- Float32 products under TF32
# Clears the 13 low mantissa bits of a float32: what TF32 keeps exactly.
_TF32_MASK = -(1 << 13)


def reduced_precision_matmuls(device: torch.device) -> bool:
    """Whether float32 matmuls on ``device`` may run in reduced precision (TF32)."""
    if is_compiling():
        return device.type == 'cuda'
    return torch.get_float32_matmul_precision() != 'highest'


def split_tf32(tensor: torch.Tensor):
    """``(high, low)``, ``high + low == tensor``, ``high`` TF32-exact; detached."""
    tensor = tensor.detach()
    high = (tensor.view(torch.int32) & _TF32_MASK).view(torch.float32)
    return high, tensor - high


def three_pass_matmul(a: torch.Tensor, b: torch.Tensor, matmul=None) -> torch.Tensor:
    """``a @ b`` as ``a_hi b_hi + a_hi b_lo + a_lo b_hi``, parts TF32-exact."""
    matmul = matmul or torch.matmul
    a_high, a_low = split_tf32(a)
    b_high, b_low = split_tf32(b)
    return matmul(a_high, b_high) + (matmul(a_high, b_low) + matmul(a_low, b_high))


class _Float32Matmul(torch.autograd.Function):
    """``a @ b`` and its gradients, each by :func:`three_pass_matmul`."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return three_pass_matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        """``dA = G B^T``, ``dB = A^T G``, each by three TF32-exact passes."""
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # (..., N, K), summed over broadcast dims
            grad_a = three_pass_matmul(grad, b.transpose(-1, -2)).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:  # (..., K, M)
            grad_b = three_pass_matmul(a.transpose(-1, -2), grad).sum_to_size(b.shape)
        return grad_a, grad_b


def float32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (..., N, K) x (..., K, M) accurate to float32 even under TF32."""
    if a.dtype == torch.float32 and b.dtype == torch.float32 \
            and reduced_precision_matmuls(a.device):
        return _Float32Matmul.apply(a, b)
    return torch.matmul(a, b)


def matmul_add(tensor: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               beta: float = 1., alpha: float = 1.) -> torch.Tensor:
    """``beta tensor + alpha a @ b`` on (n, N, K) x (n, K, M), float32-accurate
    as :func:`float32_matmul`; one ``baddbmm`` where matmuls are exact."""
    if a.dtype == torch.float32 and reduced_precision_matmuls(a.device):
        return beta * tensor + alpha * _Float32Matmul.apply(a, b)
    return torch.baddbmm(tensor, a, b, beta=beta, alpha=alpha)


# --- Memory-saving: chunked K1 . (middle . (K1^T V))
def _chunks(tokens: int, chunk: int) -> List[Tuple[int, int]]:
    return [(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk)]


def kernel_summary(left: torch.Tensor, right: torch.Tensor, values: torch.Tensor,
                   chunk: int) -> torch.Tensor:
    """``K1^T V`` chunk by chunk, ``K1 = exp(left . right^T)``: (B, h, m, d)."""
    summary = None
    for start, end in _chunks(left.shape[-2], chunk):
        kernel = kernel_of_operands(left[..., start:end, :], right)  # (B, h, c, m)
        part = kernel.transpose(-1, -2) @ values[..., start:end, :]
        summary = part if summary is None else summary.add_(part)
    return summary


def kernel_apply(left: torch.Tensor, right: torch.Tensor, factor: torch.Tensor,
                 chunk: int) -> torch.Tensor:
    """``K1 . factor`` chunk by chunk: (B, h, N, d)."""
    out = left.new_empty(*left.shape[:-1], factor.shape[-1])
    for start, end in _chunks(left.shape[-2], chunk):
        kernel = kernel_of_operands(left[..., start:end, :], right)  # (B, h, c, m)
        torch.matmul(kernel, factor, out=out[..., start:end, :])
    return out


class ChunkedKernelProduct(torch.autograd.Function):
    """Autograd function of :func:`chunked_kernel_product`; keeps no N x m tensor."""

    @staticmethod
    def forward(ctx, queries, bottleneck, middle, values, chunk, query_scale):
        left, right = kernel_operands(queries * query_scale, bottleneck)
        if queries.shape[-2] <= chunk:
            # One chunk: one kernel evaluation serves both products.
            kernel = kernel_of_operands(left, right)  # (B, h, N, m)
            summary = kernel.transpose(-1, -2) @ values  # (B, h, m, d)
            factor = middle @ summary  # (B, h, m, d)
            out = kernel @ factor  # (B, h, N, d)
        else:
            summary = kernel_summary(left, right, values, chunk)
            factor = middle @ summary
            out = kernel_apply(left, right, factor, chunk)
        ctx.save_for_backward(queries, bottleneck, middle, values, summary, factor)
        ctx.chunk = chunk
        ctx.query_scale = query_scale
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        """With ``S = K1^T V``, ``R = middle S``, ``out = K1 R``, ``G = dL/d out``,
        ``K1 = exp(E)``, ``E = A B^T``, ``A = [Q, -|Q|^2 / 2, 1]``,
        ``B = [L, 1, -|L|^2 / 2]`` (``Q = s Q0``): ``dR = K1^T G``,
        ``d middle = dR S^T``, ``dS = middle^T dR``, ``dV = K1 dS``,
        ``dE = (G R^T + V dS^T) o K1``, ``dA = dE B``, ``dB = dE^T A``;
        ``dQ0 = s (dA_Q - dA_|Q| Q)``, ``dL = dB_L - dB_|L| L``; K1 is
        recomputed chunk by chunk."""
        queries, bottleneck, middle, values, summary, factor = ctx.saved_tensors
        scale = ctx.query_scale
        scaled = queries * scale  # Q: (B, h, N, d)
        left, right = kernel_operands(scaled, bottleneck)  # (B, h, N | m, d + 2)
        tokens, dims = queries.shape[-2:]
        # N x m temporaries in slices of at most BACKWARD_CHUNK tokens on the CPU.
        step = min(ctx.chunk, BACKWARD_CHUNK) if queries.device.type == 'cpu' \
            else ctx.chunk
        # One chunk: its kernel serves both passes, evaluated once.
        whole_kernel = (kernel_of_operands(left, right) if tokens <= ctx.chunk
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
                                         values[..., start:end, :]), -1)  # (B,h,c,2d)
            grad_exponent = (grad_and_values @ factors_t).mul_(kernel)  # dE
            grad_left[..., start:end, :] = grad_exponent @ right
            grad_right += grad_exponent.transpose(-1, -2) @ left[..., start:end, :]
        grad_queries = scale * (grad_left[..., :dims] - grad_left[..., dims:dims + 1]
                                * scaled)
        grad_bottleneck = (grad_right[..., :dims]
                           - grad_right[..., dims + 1:] * bottleneck)
        return grad_queries, grad_bottleneck, grad_middle, grad_values, None, None


def chunked_kernel_product(queries: torch.Tensor, bottleneck: torch.Tensor,
                           middle: torch.Tensor, values: torch.Tensor,
                           chunk: int, query_scale: float = 1.) -> torch.Tensor:
    """``K1 . (middle . (K1^T V))``, ``K1 = k(Q, L)`` recomputed in backward.

    Args:
        queries (Tensor): Q0, (B, h, N, d); ``Q = query_scale * Q0``.
        bottleneck (Tensor): L, (B, h, m, d).
        middle (Tensor): (B, h, m, m).
        values (Tensor): V, (B, h, N, d).
        chunk (int): Tokens per chunk.

    Returns:
        Tensor: (B, h, N, d).
    """
    return apply_without_autocast(ChunkedKernelProduct, queries, bottleneck, middle,
                                  values, chunk, query_scale)
