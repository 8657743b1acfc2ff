"""SOFT's kernel inverse: the Gaussian kernel A = k(L, L) of the bottleneck
tokens L and the matrix between the kernel products, ``middle``:
``(A + 0.01 I)^-1`` (SOFT) or ``D^-1/2 pinv(A) D^-1/2``, ``D = diag(A 1)``
(SOFT++), by Newton's iteration, in closed form or exactly
(docs/soft_design.md).

:func:`middle_matrix` is the reference. :func:`newton_middle` is the
training implementation of the Newton iteration: A, the step size, the
iteration and the scaling in one operation (a Triton kernel on CUDA), whose
backward recomputes them from L.
"""
from itertools import islice
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ._library import (apply_without_autocast, autocast_off, backward_without_autocast,
                       full_precision, is_compiling, register, runs_reference,
                       runs_triton, strided_like)

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'newton_closed_form', 'exact')
#: Device types where ``'newton_closed_form'`` uses ``eigh``; elsewhere it iterates.
CLOSED_FORM_DEVICES = ('cpu', )
EIGH_DTYPE = torch.float64
#: SOFT++ takes the pseudo-inverse of at least this many bottleneck tokens.
MIN_PSEUDO_INVERSE_TOKENS = 3


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


def three_pass_matmul(a: torch.Tensor, b: torch.Tensor,
                      matmul=torch.matmul) -> torch.Tensor:
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
                               num_iters: int,
                               grad_output: torch.Tensor) -> torch.Tensor:
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
                                    alpha: torch.Tensor,
                                    num_iters: int) -> torch.Tensor:
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
        # (..., m), (..., m, m)
        eigvals, eigvecs = torch.linalg.eigh(operand.to(EIGH_DTYPE))
        alpha = alpha.squeeze(-1).to(EIGH_DTYPE)  # (..., 1)
        weights = newton_on_eigenvalues(eigvals, alpha, num_iters)
        eigvecs = eigvecs.to(operand.dtype)
        ctx.save_for_backward(eigvals, eigvecs, alpha)
        ctx.num_iters = num_iters
        weighted = eigvecs * weights.to(operand.dtype).unsqueeze(-2)
        return weighted @ eigvecs.transpose(-1, -2)

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
        factor = torch.linalg.cholesky(newton_operand(mat, 'soft'))
        return torch.cholesky_inverse(factor)
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
                   num_iters: int = 20) -> torch.Tensor:
    """Differentiable ``(A + 0.01 I)^-1`` (``'soft'``) or ``pinv(A)`` (``'soft++'``)
    of symmetric A (B, ..., m, m), B indexing images; float32 for half inputs.

    ``solver`` runs as :func:`solver_that_runs` says on A's device."""
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
        return newton_iterations(operand, alpha, num_iters)


def block_mask(inside: torch.Tensor) -> torch.Tensor:
    """(B, 1, m, m): 1 between two tokens of an image, of ``inside`` (B, m)."""
    inside = inside[:, None]  # (B, 1, m)
    return inside.unsqueeze(-1) * inside.unsqueeze(-2)


def scale_and_mask(inverse: torch.Tensor, kernel_a: torch.Tensor, variant: str,
                   inside: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``middle`` from the inverse of A (B, h, m, m): SOFT++'s ``D^-1/2 inverse
    D^-1/2``, ``D = diag(A 1)`` (a padding token's row sum taken as 1), zero
    outside the blocks of ``inside`` (B, m) when given."""
    if variant == 'soft++':
        row_sums = kernel_a.sum(-1)  # (B, h, m)
        if inside is not None:
            row_sums = row_sums + (1 - inside[:, None])
        inverse = scaled_both_sides(inverse, row_sums.rsqrt())
    return inverse if inside is None else inverse * block_mask(inside)


def token_mask(token_counts: List[int], tokens: int, device,
               dtype: torch.dtype) -> torch.Tensor:
    """(B, m): 1 for the first ``token_counts[i]`` of image i's m tokens."""
    index = torch.arange(tokens, device=device)
    return torch.stack([index < count for count in token_counts]).to(dtype)


def shares_one_iteration(variant: str, solver: str, tokens: int,
                         token_counts: Optional[List[int]]) -> bool:
    """Whether the images share one Newton iteration over block-diagonal
    kernels: where Newton runs and every image's inverse has one formula."""
    formula = inverse_formula(variant, tokens)
    return solver == 'newton' and (token_counts is None or all(
        inverse_formula(variant, count) == formula for count in token_counts))


def middle_matrix(kernel_a: torch.Tensor, variant: str, solver: str,
                  newton_iters: int,
                  token_counts: Optional[List[int]] = None) -> torch.Tensor:
    """``middle`` of the bottleneck's kernel A = k(L, L) (B, h, m, m):
    ``(A + 0.01 I)^-1`` (``'soft'``) or ``D^-1/2 pinv(A) D^-1/2`` (``'soft++'``).

    Image i's middle is that of its first ``token_counts[i]`` tokens, zero
    elsewhere. Where Newton iterates, the images share it: A, zero outside each
    image's tokens, is block-diagonal, and so is every iterate."""
    tokens = kernel_a.shape[-1]
    if token_counts is None or all(count == tokens for count in token_counts):
        inverse = kernel_inverse(kernel_a, variant, solver, newton_iters)
        return scale_and_mask(inverse, kernel_a, variant)

    if shares_one_iteration(variant, solver_that_runs(solver, kernel_a.device.type),
                            tokens, token_counts):
        inside = token_mask(token_counts, tokens, kernel_a.device, kernel_a.dtype)
        kernel_a = kernel_a * block_mask(inside)
        inverse = kernel_inverse(kernel_a, variant, solver, newton_iters)
        return scale_and_mask(inverse, kernel_a, variant, inside)

    middles = [middle_matrix(kernel_a[i:i + 1, :, :count, :count], variant, solver,
                             newton_iters)
               for i, count in enumerate(token_counts)]  # (1, h, c, c) each
    return torch.cat([F.pad(middle, (0, tokens - middle.shape[-1]) * 2)
                      for middle in middles])


# --- The training implementation: the Newton inverse as one operation
#: Bottleneck tokens up to which CUDA runs the Newton inverse as one Triton
#: kernel per matrix (the configs cap them at 256); more iterate with torch's
#: batched products.
MAX_FUSED_TOKENS = 256


def masked_kernel(bottleneck: torch.Tensor,
                  inside: Optional[torch.Tensor]) -> torch.Tensor:
    """A = k(L, L) (B, h, m, m) of L (B, h, m, d), zero outside the blocks of
    ``inside`` (B, m)."""
    kernel_a = gaussian_kernel(bottleneck, bottleneck, float32_products=True)
    return kernel_a if inside is None else kernel_a * block_mask(inside)


def _newton_forward_shapes(bottleneck, inside, variant, num_iters):
    batch, heads, tokens = bottleneck.shape[:3]
    return (bottleneck.new_empty(batch, heads, tokens, tokens),
            bottleneck.new_empty(batch, heads))


@register('newton_middle_forward', launches=1, fake=_newton_forward_shapes)
def newton_middle_forward(bottleneck: torch.Tensor, inside: Optional[torch.Tensor],
                          variant: str, num_iters: int
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``middle`` (B, h, m, m) of L (B, h, m, d) by ``num_iters`` Newton steps,
    and the step sizes alpha (B, h)."""
    if runs_triton(bottleneck) and bottleneck.shape[-2] <= MAX_FUSED_TOKENS:
        from .triton.soft_inverse import inverse_forward
        return inverse_forward(bottleneck, inside, variant, num_iters)

    kernel_a = masked_kernel(bottleneck, inside)  # (B, h, m, m)
    alpha = newton_scale(kernel_a, variant)  # (B, 1 or h, 1, 1)
    inverse = newton_iterations(newton_operand(kernel_a, variant), alpha, num_iters)
    middle = scale_and_mask(inverse, kernel_a, variant, inside)
    return middle, alpha.expand(*kernel_a.shape[:2], 1, 1).flatten(1).contiguous()


@register('newton_middle_backward', launches=1,
          fake=lambda grad, bottleneck, *args: torch.empty_like(bottleneck))
def newton_middle_backward(grad_middle: torch.Tensor, bottleneck: torch.Tensor,
                           inside: Optional[torch.Tensor], alpha: torch.Tensor,
                           variant: str, num_iters: int) -> torch.Tensor:
    """dL (B, h, m, d) of :func:`newton_middle_forward`, G = d middle.

    With A, its iterate V_k and ``s = D^-1/2`` recomputed, G restricted to the
    blocks: SOFT++'s scaling gives ``dV_k = s s^T o G`` and ``dr = -s^3 / 2 o
    ((W + W^T) s)``, ``W = G o V_k``; the Newton adjoint gives dP
    (:func:`newton_iterations_backward`); ``dA = (dP + dr 1^T) o blocks``;
    ``dE = dA o A``, ``dL = (dE + dE^T) L - L o rowsum(dE + dE^T)``.
    """
    if runs_triton(bottleneck) and bottleneck.shape[-2] <= MAX_FUSED_TOKENS:
        from .triton.soft_inverse import inverse_backward
        return inverse_backward(grad_middle, bottleneck, inside, alpha, variant,
                                num_iters)

    kernel_a = masked_kernel(bottleneck, inside)  # (B, h, m, m)
    operand = newton_operand(kernel_a, variant)  # P
    alpha = alpha[..., None, None]  # (B, h, 1, 1)
    grad = grad_middle if inside is None else grad_middle * block_mask(inside)
    if variant == 'soft++':
        row_sums = kernel_a.sum(-1)  # (B, h, m)
        if inside is not None:
            row_sums = row_sums + (1 - inside[:, None])
        scale = row_sums.rsqrt()
        weighted = grad * newton_iterations(operand, alpha, num_iters)  # W
        grad_scale = (weighted + weighted.transpose(-1, -2)) @ scale.unsqueeze(-1)
        grad_rows = -0.5 * scale.pow(3).unsqueeze(-1) * grad_scale  # (B, h, m, 1)
        grad = scaled_both_sides(grad, scale)

    grad_kernel = newton_iterations_backward(operand, alpha, num_iters, grad)
    if variant == 'soft++':
        grad_kernel = grad_kernel + grad_rows
    if inside is not None:
        grad_kernel = grad_kernel * block_mask(inside)
    grad_exponent = grad_kernel * gaussian_kernel(bottleneck, bottleneck,
                                                  float32_products=True)
    both_sides = grad_exponent + grad_exponent.transpose(-1, -2)  # (B, h, m, m)
    grad = both_sides @ bottleneck - bottleneck * both_sides.sum(-1, keepdim=True)
    return strided_like(grad, bottleneck)


class NewtonMiddle(torch.autograd.Function):
    """``middle`` of L by Newton's iteration, keeping only L and the step sizes;
    backward :func:`newton_middle_backward`."""

    @staticmethod
    def forward(ctx, bottleneck, inside, variant, num_iters):
        middle, alpha = newton_middle_forward(bottleneck, inside, variant, num_iters)
        ctx.save_for_backward(bottleneck, inside, alpha)
        ctx.variant, ctx.num_iters = variant, num_iters
        return middle

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad):
        bottleneck, inside, alpha = ctx.saved_tensors
        grad_bottleneck = newton_middle_backward(grad, bottleneck, inside, alpha,
                                                 ctx.variant, ctx.num_iters)
        return grad_bottleneck, None, None, None


def soft_middle(bottleneck: torch.Tensor, variant: str, solver: str, newton_iters: int,
                token_counts: Optional[List[int]] = None,
                inside: Optional[torch.Tensor] = None,
                fused: bool = True) -> torch.Tensor:
    """``middle`` (B, h, m, m) of the bottleneck tokens L (B, h, m, d), image i's
    of its first ``token_counts[i]`` tokens (``inside``: their (B, m) mask).

    Where Newton iterates and ``fused``, the training implementation
    (:class:`NewtonMiddle`) runs; elsewhere the reference, :func:`middle_matrix`."""
    tokens = bottleneck.shape[-2]
    solver = solver_that_runs(solver, bottleneck.device.type)
    if runs_reference(fused, bottleneck) \
            or not shares_one_iteration(variant, solver, tokens, token_counts):
        kernel_a = gaussian_kernel(bottleneck, bottleneck, float32_products=True)
        return middle_matrix(kernel_a, variant, solver, newton_iters, token_counts)

    if inside is None and token_counts is not None:
        inside = token_mask(token_counts, tokens, bottleneck.device, bottleneck.dtype)
    return apply_without_autocast(NewtonMiddle, bottleneck, inside,
                                  inverse_formula(variant, tokens), newton_iters)
