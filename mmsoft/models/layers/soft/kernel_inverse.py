"""Inverses of the bottleneck kernel matrix used by SOFT attention.

Two variants (see :func:`~mmsoft.models.layers.low_rank_kernel_attention`):

* ``'soft'``: the regularised inverse of ``P = A + 0.01 I``.
* ``'soft++'``: the Moore-Penrose pseudo-inverse of ``P = A`` (no regulariser).

and three solvers, named after what they compute:

* ``'newton'``: ``k`` steps of the Newton-Raphson iteration ``V <- 2V - V P V``
  from ``V0 = alpha * P``, as the reference implementation runs it (and as
  every published checkpoint was trained). ``O(k m^3)``, m x m products
  only, forward and backward. Its backward is the exact derivative of the
  ``k`` steps (:class:`_NewtonIterations`), recomputing the iterates.
* ``'newton_closed_form'``: the same function from one eigendecomposition
  ``P = Q diag(lambda) Q^T``. Every iterate is a polynomial in ``P``, so
  ``V_k = Q diag(g_k(lambda)) Q^T`` where ``g_k`` is the scalar Newton
  iteration ``v <- v (2 - lambda v)`` from ``v0 = alpha * lambda``, i.e.
  ``g_k(lambda) = (1 - (1 - alpha lambda^2)^(2^k)) / lambda``. Its backward is
  the exact derivative of that spectral function (divided differences of
  ``g_k``), the same as ``'newton'``'s. It runs the eigendecomposition in
  float64, which is fast on CPUs and slow on GPUs, so it runs only on the
  devices in :data:`CLOSED_FORM_DEVICES` (the CPU); elsewhere
  ``'newton_closed_form'`` computes the same function by the iteration.
* ``'exact'``: the limit ``k -> infinity``: ``(A + 0.01 I)^-1`` by a Cholesky
  factorisation for SOFT, ``pinv(A)`` by an eigendecomposition for SOFT++.
  Where ``A`` is ill-conditioned (large inputs, many bottleneck tokens) this
  is a different function from the iteration's: 20 steps do not invert
  eigenvalues below about ``1 / sqrt(alpha 2^20)``.

``'cholesky'``, the former name of ``'exact'``, is accepted with a
``DeprecationWarning``.

The Newton scale ``alpha`` is computed per matrix for SOFT (as the reference
does) and per image for SOFT++ (the reference uses one scale for the whole
batch, which makes an image's features depend on its batch-mates; per image
it equals the reference at batch size 1). It is a step size: no gradient
flows through it.

All forward computations run without an autograd graph, in float32 (or
float64) under autocast too. ``'newton'`` and ``'newton_closed_form'``
backpropagate the derivative of ``V_k`` itself, ``'exact'`` that of the
matrix inverse, ``dL/dP = -V^T G V^T``.
"""
import warnings

import torch

from ....utils import check_choice
from ....utils.torch_compat import is_compiling
from ..shared.precision import (apply_without_autocast, backward_without_autocast,
                                full_precision)

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'newton_closed_form', 'exact')
RENAMED_SOLVERS = {'cholesky': 'exact'}
# The closed form's eigendecomposition runs in float64: float32's eigenvalue
# errors (about eps * ||A||) are amplified by g_k' near the convergence
# threshold of the iteration, up to 7e-3 relative at condition number 1e8,
# while in float64 the result is closer to float64 Newton than float32
# Newton itself.
EIGH_DTYPE = torch.float64
#: Device types on which ``'newton_closed_form'`` runs its float64
#: eigendecomposition. On others (GPUs: slow float64, batched eigh of small
#: matrices bound by latency) it runs the iteration, the same function.
CLOSED_FORM_DEVICES = ('cpu', )


def canonical_solver(solver: str) -> str:
    """The current name of ``solver``; a former name gives a warning.

    Args:
        solver (str): A solver name, current or former.

    Returns:
        str: One of :data:`SOLVERS` (unknown names are returned unchanged for
        the caller to reject).
    """
    if solver in RENAMED_SOLVERS:
        new_name = RENAMED_SOLVERS[solver]
        warnings.warn(
            f"solver={solver!r} is deprecated: it is the exact inverse, now "
            f"spelled solver={new_name!r}.", DeprecationWarning, stacklevel=3)
        return new_name
    return solver


def _eye_like(mat: torch.Tensor) -> torch.Tensor:
    return torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)


def _is_tracing() -> bool:
    """Whether the code runs under a tracer or exporter (no data-dependent
    Python control flow allowed)."""
    return (torch.jit.is_tracing() or is_compiling()
            or torch.onnx.is_in_onnx_export())


def _per_image_max(values: torch.Tensor) -> torch.Tensor:
    """Max over all but the first dimension, broadcastable to (B, ..., 1, 1).

    values: (B, ...) -> (B, 1, ..., 1) with the rank of ``values`` plus one.
    """
    if values.dim() <= 1:
        return values.amax().reshape(*([1] * (values.dim() + 1)))
    peak = values.flatten(1).amax(1)  # (B, )
    return peak.reshape(-1, *([1] * values.dim()))


# --------------------------------------------------------------------------
# The Newton iteration's operand and starting scale
# --------------------------------------------------------------------------
def newton_operand(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """The matrix P the iteration inverts: ``A + 0.01 I`` (SOFT) or ``A``.

    Args:
        mat (Tensor): Kernel matrices A, (..., m, m).
        variant (str): ``'soft'`` or ``'soft++'``.

    Returns:
        Tensor: (..., m, m).
    """
    if variant == 'soft':
        return mat + REGULARISER * _eye_like(mat)
    return mat


def regularised_newton_scale(mat: torch.Tensor) -> torch.Tensor:
    """SOFT's ``alpha = 0.9 * 2 / (max row sum of A)^2``, per matrix.

    Args:
        mat (Tensor): Kernel matrices A, (..., m, m).

    Returns:
        Tensor: (..., 1, 1).
    """
    max_row_sum = mat.sum(-1).amax(-1)  # (...)
    return (0.9 * 2 / max_row_sum.pow(2))[..., None, None]


def pseudo_inverse_newton_scale(mat: torch.Tensor,
                                max_halvings: int = 10) -> torch.Tensor:
    """SOFT++'s ``alpha``: ``2 / (max row sum)^2``, halved while the
    column-sum norm of ``I - alpha A^2`` exceeds 1.01 (at most
    ``max_halvings`` times).

    As in the reference, one ``alpha`` serves all the heads of an image
    (maximum over heads and rows); unlike the reference, whose ``alpha``
    spans the whole batch, it is taken per image (the first dimension).

    Args:
        mat (Tensor): Kernel matrices A, (B, ..., m, m); the leading dimension
            indexes images.
        max_halvings (int): Most halvings. Default: 10.

    Returns:
        Tensor: (B, 1, ..., 1, 1), broadcastable to ``mat``.
    """
    eye = _eye_like(mat)
    square = mat @ mat  # (B, ..., m, m)
    alpha = 2 / _per_image_max(mat.sum(-1)).pow(2)  # (B, 1, ..., 1)
    for _ in range(max_halvings):
        residual = (eye - alpha * square).abs().sum(-2)  # (B, ..., m)
        too_large = _per_image_max(residual) > 1.01  # (B, 1, ..., 1)
        alpha = torch.where(too_large, alpha * 0.5, alpha)
        # Once an image's residual is small enough its alpha stays put, so
        # further rounds change nothing: stop early in eager mode, run them
        # all where data-dependent control flow cannot be traced.
        if not _is_tracing() and not bool(too_large.any()):
            break
    return alpha


def newton_scale(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """The starting scale ``alpha`` (``V0 = alpha * P``) of ``variant``.

    Args:
        mat (Tensor): Kernel matrices A, (B, ..., m, m).
        variant (str): ``'soft'`` or ``'soft++'``.

    Returns:
        Tensor: Broadcastable to ``mat``: (..., 1, 1).
    """
    if variant == 'soft':
        return regularised_newton_scale(mat)
    return pseudo_inverse_newton_scale(mat)


# --------------------------------------------------------------------------
# The iteration, on matrices and on eigenvalues
# --------------------------------------------------------------------------
def newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                      num_iters: int) -> torch.Tensor:
    """``num_iters`` steps of ``V <- 2V - V P V`` from ``V0 = alpha * P``.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps.

    Returns:
        Tensor: (..., m, m).
    """
    inverse = alpha * operand
    for _ in range(num_iters):
        inverse = 2 * inverse - inverse @ operand @ inverse
    return inverse


def newton_iterates(operand: torch.Tensor, alpha: torch.Tensor,
                    num_iters: int) -> list:
    """``[(V_0, V_0 P), ..., (V_{k-1}, V_{k-1} P)]`` of
    :func:`newton_iterations` (each (..., m, m)): the iterates its backward
    differentiates at, with the product each step forms."""
    inverse = alpha * operand
    iterates = []
    for step in range(num_iters):
        product = inverse @ operand  # V_j P
        iterates.append((inverse, product))
        if step + 1 < num_iters:
            inverse = 2 * inverse - product @ inverse
    return iterates


def newton_iterations_backward(operand: torch.Tensor, alpha: torch.Tensor,
                               num_iters: int,
                               grad_output: torch.Tensor) -> torch.Tensor:
    """``dL/dP`` of ``V_k = newton_iterations(P, alpha, k)``, exactly.

    Reverse mode through ``V_{j+1} = 2 V_j - (V_j P) V_j`` with ``G_{j+1} =
    dL/dV_{j+1}`` and ``W = G_{j+1} V_j^T``:
    ``G_j = 2 G_{j+1} - W P^T - (V_j P)^T G_{j+1}``,
    ``dL/dP += -V_j^T W``; at the start, ``dL/dP += alpha G_0``.
    The iterates are recomputed (:func:`newton_iterates`).

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1); constant.
        num_iters (int): Steps k.
        grad_output (Tensor): ``dL/dV_k``, (..., m, m).

    Returns:
        Tensor: ``dL/dP``, (..., m, m).
    """
    grad = grad_output  # G_k
    grad_operand = torch.zeros_like(operand)
    operand_t = operand.transpose(-1, -2)
    for inverse, product in reversed(newton_iterates(operand, alpha, num_iters)):
        weighted = grad @ inverse.transpose(-1, -2)  # W, (..., m, m)
        grad_operand -= inverse.transpose(-1, -2) @ weighted
        grad = (2 * grad - weighted @ operand_t
                - product.transpose(-1, -2) @ grad)  # G_j
    return grad_operand + alpha * grad


class _NewtonIterations(torch.autograd.Function):
    """``V_k(P)`` by the iteration, without a graph; backward is its exact
    derivative (:func:`newton_iterations_backward`). Keeps P only."""

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


def newton(operand: torch.Tensor, alpha: torch.Tensor, num_iters: int) -> torch.Tensor:
    """:func:`newton_iterations`, differentiable in ``operand`` at the cost of
    keeping it alone (``alpha`` is a constant).

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k >= 1.

    Returns:
        Tensor: (..., m, m), float32 or float64 (also under autocast).
    """
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonIterations, operand, alpha, num_iters)


def newton_on_eigenvalues(eigvals: torch.Tensor, alpha: torch.Tensor,
                          num_iters: int) -> torch.Tensor:
    """``g_k(lambda)``: the Newton iteration run on each eigenvalue.

    ``v <- v (2 - lambda v)`` from ``v0 = alpha * lambda``; then
    ``1 - lambda v`` squares at every step, so
    ``g_k(lambda) = (1 - (1 - alpha lambda^2)^(2^k)) / lambda``, computed here
    without the cancellation of that formula and defined at ``lambda = 0``.

    Args:
        eigvals (Tensor): Eigenvalues lambda, (..., m).
        alpha (Tensor): Scales broadcastable to ``eigvals``, (..., 1).
        num_iters (int): Steps k.

    Returns:
        Tensor: (..., m).
    """
    value = alpha * eigvals
    for _ in range(num_iters):
        value = value * (2 - eigvals * value)
    return value


def newton_divided_difference_pairs(larger: torch.Tensor, smaller: torch.Tensor,
                                    alpha: torch.Tensor,
                                    num_iters: int) -> torch.Tensor:
    """``(g_k(a) - g_k(b)) / (a - b)`` for pairs ``a >= b`` (``g_k'(a)`` where
    ``a = b``), carried through the iteration instead of formed by a division.

    With ``v' = 2v - l v^2`` on both eigenvalues,
    ``D' = D (2 - b (v_a + v_b)) - v_a^2`` from ``D0 = alpha``. Taking b as the
    smaller eigenvalue keeps the recursion stable: its factor stays in
    [0, 2] (``l v`` never exceeds 1 after the first step), where the mirrored
    form reaches ``1 - a / b`` and amplifies rounding errors once both
    eigenvalues have converged.

    Args:
        larger (Tensor): a, any shape S.
        smaller (Tensor): b <= a, shape S.
        alpha (Tensor): The scale of each pair, shape S.
        num_iters (int): Steps k.

    Returns:
        Tensor: Shape S.
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
    """Divided differences of ``g_k`` between all pairs of eigenvalues.

    ``D[i, j] = (g_k(l_i) - g_k(l_j)) / (l_i - l_j)`` and ``D[i, i] =
    g_k'(l_i)``, by the gap between the two eigenvalues relative to the
    larger magnitude:

    * above ``close``: the quotient itself, which loses at most about
      ``2 eps / close`` to cancellation;
    * below ``1e-5 / 2^(k+1)``: the mean of the two derivatives. ``g_k``
      varies on the scale ``lambda / 2^(k+1)`` at its steepest (where
      ``alpha lambda^2`` is near 2), so this is off by about 1e-10;
    * in between, usually a few pairs:
      :func:`newton_divided_difference_pairs`, exact whatever the gap.

    Args:
        eigvals (Tensor): Eigenvalues, (..., m).
        alpha (Tensor): Scales broadcastable to ``eigvals``, (..., 1).
        num_iters (int): Steps k.
        close (float): Relative gap below which the quotient is not used.
            Default: 1e-3.

    Returns:
        Tensor: (..., m, m), symmetric.
    """
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
    """``Q diag(w) Q^T``. eigvecs: (..., m, m); weights: (..., m)."""
    return (eigvecs * weights.unsqueeze(-2)) @ eigvecs.transpose(-1, -2)


class _NewtonClosedForm(torch.autograd.Function):
    """``V_k(P)`` from one eigendecomposition, with its exact derivative.

    Backward (Daleckii-Krein): for ``F(P) = Q g(diag(l)) Q^T``,
    ``dL/dP = Q (D o (Q^T G Q)) Q^T`` with D the divided differences of g.
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
    """What :func:`newton_iterations` computes, from one ``eigh``.

    Differentiable in ``operand`` (exactly, see :class:`_NewtonClosedForm`);
    ``alpha`` is a constant.

    Args:
        operand (Tensor): Symmetric P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Newton steps k.

    Returns:
        Tensor: (..., m, m).
    """
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonClosedForm, operand, alpha, num_iters)


# --------------------------------------------------------------------------
# The exact limits
# --------------------------------------------------------------------------
def cholesky_regularised_inverse(mat: torch.Tensor) -> torch.Tensor:
    """Exact ``(A + 0.01 I)^-1`` through a Cholesky factorisation.

    Args:
        mat (Tensor): Symmetric positive semi-definite matrices, (..., m, m).

    Returns:
        Tensor: Shape (..., m, m).
    """
    factor = torch.linalg.cholesky(newton_operand(mat, 'soft'))
    return torch.cholesky_inverse(factor)


def eigh_pseudo_inverse(mat: torch.Tensor, rtol: float = None) -> torch.Tensor:
    """Exact Moore-Penrose pseudo-inverse of symmetric matrices.

    Eigenvalues below ``rtol * max|eigenvalue|`` (default: ``m * eps`` of the
    dtype, as ``torch.linalg.pinv``) are treated as zero.

    Args:
        mat (Tensor): Symmetric matrices, (..., m, m).
        rtol (float, optional): Relative cut-off for small eigenvalues.

    Returns:
        Tensor: Shape (..., m, m).
    """
    return torch.linalg.pinv(mat, rtol=rtol, hermitian=True)


def exact_inverse(mat: torch.Tensor, variant: str) -> torch.Tensor:
    """The limit of the iteration: ``(A + 0.01 I)^-1`` or ``pinv(A)``."""
    if variant == 'soft':
        return cholesky_regularised_inverse(mat)
    return eigh_pseudo_inverse(mat)


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------
def newton_inverse(mat: torch.Tensor, variant: str,
                   num_iters: int = 20) -> torch.Tensor:
    """The reference Newton iteration on ``mat``'s operand (no graph built).

    Args:
        mat (Tensor): Kernel matrices A, (B, ..., m, m).
        variant (str): ``'soft'`` or ``'soft++'``.
        num_iters (int): Steps. Default: 20.

    Returns:
        Tensor: (B, ..., m, m).
    """
    return newton_iterations(newton_operand(mat, variant), newton_scale(mat, variant),
                             num_iters)


def newton_regularised_inverse(mat: torch.Tensor, num_iters: int = 20) -> torch.Tensor:
    """Newton-Raphson approximation of ``(A + 0.01 I)^-1`` (SOFT)."""
    return newton_inverse(mat, 'soft', num_iters)


def newton_pseudo_inverse(mat: torch.Tensor, num_iters: int = 20) -> torch.Tensor:
    """Newton-Raphson approximation of ``pinv(A)`` (SOFT++)."""
    return newton_inverse(mat, 'soft++', num_iters)


def solve_kernel_inverse(mat: torch.Tensor, variant: str, solver: str,
                         num_iters: int = 20) -> torch.Tensor:
    """Dispatches to the inverse of ``variant`` computed by ``solver``
    (``'newton'`` or ``'exact'``; no autograd graph is built)."""
    if solver == 'newton':
        return newton_inverse(mat, variant, num_iters)
    return exact_inverse(mat, variant)


class _ExactInverse(torch.autograd.Function):
    """:func:`exact_inverse` computed without a graph; backward is that of a
    matrix inverse, ``-V^T G V^T``."""

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


def check_kernel_inverse_options(variant: str, solver: str) -> str:
    """Validates ``variant`` and ``solver``; returns the solver's current name.

    Raises:
        ValueError: Naming the argument, its value and the accepted values.
    """
    check_choice('variant', variant, VARIANTS)
    solver = canonical_solver(solver)
    check_choice('solver', solver, SOLVERS)
    return solver


def kernel_inverse(mat: torch.Tensor, variant: str = 'soft',
                   solver: str = 'newton', num_iters: int = 20) -> torch.Tensor:
    """Inverse of bottleneck kernel matrices, differentiable.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (B, ..., m, m); the
            leading dimension indexes images.
        variant (str): ``'soft'`` for ``(A + 0.01 I)^-1`` or ``'soft++'`` for
            ``pinv(A)``. Default: ``'soft'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``
            (see the module docstring). Default: ``'newton'``.
        num_iters (int): Newton steps (``'newton'`` and
            ``'newton_closed_form'``). Default: 20.

    Returns:
        Tensor: Shape (B, ..., m, m), float32 for half or bfloat16 ``mat``
        (under autocast or not), else the dtype of ``mat``.
    """
    solver = check_kernel_inverse_options(variant, solver)
    with torch.autocast(device_type=mat.device.type, enabled=False):
        mat = full_precision(mat)
        if solver == 'exact':
            return _ExactInverse.apply(mat, variant)
        with torch.no_grad():
            alpha = newton_scale(mat, variant)
        operand = newton_operand(mat, variant)
        if solver == 'newton_closed_form' and mat.device.type in CLOSED_FORM_DEVICES:
            return newton_closed_form(operand, alpha, num_iters)
        return newton(operand, alpha, num_iters)
