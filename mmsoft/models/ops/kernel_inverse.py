"""Inverses of the bottleneck kernel matrix used by SOFT attention.

Two variants (see :func:`~mmsoft.models.layers.low_rank_kernel_attention`):

* ``'soft'``: the regularised inverse of ``P = A + 0.01 I``.
* ``'soft++'``: the Moore-Penrose pseudo-inverse of ``P = A``.

Three solvers:

* ``'newton'``: ``k`` steps of ``V <- 2V - V P V`` from ``V0 = alpha * P``
  (:func:`~mmsoft.models.ops.newton.newton_iterations`).
* ``'newton_closed_form'``: the same function from one eigendecomposition
  ``P = Q diag(lambda) Q^T``: ``V_k = Q diag(g_k(lambda)) Q^T`` with
  ``g_k(lambda) = (1 - (1 - alpha lambda^2)^(2^k)) / lambda``; its backward is
  the derivative of that spectral function. Runs on the devices in
  :data:`CLOSED_FORM_DEVICES`; elsewhere it runs the iteration.
* ``'exact'``: ``(A + 0.01 I)^-1`` by Cholesky for SOFT, ``pinv(A)`` by an
  eigendecomposition for SOFT++; backward is that of a matrix inverse.

``'cholesky'`` is a deprecated alias of ``'exact'``.

``alpha`` is computed per matrix for SOFT and per image for SOFT++; no
gradient flows through it. Forward computations run in float32 (or float64)
under autocast too. See ``docs/soft_design.md`` for the reasons.
"""
import os
import sys
import warnings
from typing import Callable

import torch

from ...utils import check_choice
from .newton import newton_iterations
from .precision import (apply_without_autocast, backward_without_autocast,
                        full_precision)

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'newton_closed_form', 'exact')
RENAMED_SOLVERS = {'cholesky': 'exact'}
#: The solver an ONNX graph computes for each solver that has an ONNX
#: formulation (ONNX has no eigendecomposition or Cholesky factorisation).
EXPORT_SOLVERS = {'newton': 'newton', 'newton_closed_form': 'newton'}
#: The dtype of the closed form's eigendecomposition.
EIGH_DTYPE = torch.float64
#: Device types on which ``'newton_closed_form'`` runs its eigendecomposition;
#: on others it runs the iteration, the same function.
CLOSED_FORM_DEVICES = ('cpu', )
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def solver_that_runs(solver: str, device_type: str) -> str:
    """The solver that computes ``solver``'s inverse on ``device_type``:
    ``'newton_closed_form'`` runs the iteration off
    :data:`CLOSED_FORM_DEVICES`; the others run as named."""
    if solver == 'newton_closed_form' and device_type not in CLOSED_FORM_DEVICES:
        return 'newton'
    return solver


def _stacklevel_outside_package() -> int:
    """The ``stacklevel`` at which :func:`warnings.warn`, called by this
    function's caller, names the first frame outside the mmsoft package."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def canonical_solver(solver: str) -> str:
    """The name of ``solver`` in :data:`SOLVERS`; a deprecated alias gives a
    ``DeprecationWarning`` attributed to the first caller outside mmsoft.

    Args:
        solver (str): A solver name or a deprecated alias.

    Returns:
        str: One of :data:`SOLVERS` (unknown names are returned unchanged for
        the caller to reject).
    """
    if solver in RENAMED_SOLVERS:
        new_name = RENAMED_SOLVERS[solver]
        warnings.warn(
            f'solver={solver!r} is deprecated: it is the exact inverse, now '
            f'spelled solver={new_name!r}.', DeprecationWarning,
            stacklevel=_stacklevel_outside_package())
        return new_name
    return solver


def _eye_like(mat: torch.Tensor) -> torch.Tensor:
    return torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)


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
    # Every round runs: once an image's residual is small enough its alpha
    # stays put, and deciding to stop early would read the values on the
    # host (a device sync).
    for _ in range(max_halvings):
        residual = (eye - alpha * square).abs().sum(-2)  # (B, ..., m)
        too_large = _per_image_max(residual) > 1.01  # (B, 1, ..., 1)
        alpha = torch.where(too_large, alpha * 0.5, alpha)
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
# The iteration on eigenvalues: the closed form
# --------------------------------------------------------------------------
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
    """What :func:`~mmsoft.models.ops.newton.newton_iterations` computes, from
    one ``eigh``.

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


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------
#: SOFT++ takes the pseudo-inverse of at least this many bottleneck tokens;
#: of fewer, SOFT's regularised inverse (:func:`inverse_formula`).
MIN_PSEUDO_INVERSE_TOKENS = 3


def inverse_formula(variant: str, tokens: int) -> str:
    """Which inverse ``variant`` takes of an m x m kernel matrix:
    ``'soft'`` ((A + 0.01 I)^-1) or ``'soft++'`` (pinv(A)).

    SOFT++ takes SOFT's regularised inverse of fewer than
    :data:`MIN_PSEUDO_INVERSE_TOKENS` tokens, whose pseudo-inverse is
    degenerate. The shape decides, not the values.

    Args:
        variant (str): ``'soft'`` or ``'soft++'``.
        tokens (int): m.

    Returns:
        str: ``'soft'`` or ``'soft++'``.
    """
    if variant == 'soft++' and tokens < MIN_PSEUDO_INVERSE_TOKENS:
        return 'soft'
    return variant


def check_kernel_inverse_options(variant: str, solver: str) -> str:
    """Validates ``variant`` and ``solver``; returns the solver's name in
    :data:`SOLVERS` (see :func:`canonical_solver`).

    Layers call it once, at construction, and pass its result to
    :func:`kernel_inverse`, which does not check again.

    Args:
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): A solver of :data:`SOLVERS` or a deprecated alias.

    Returns:
        str: The solver's name in :data:`SOLVERS`.

    Raises:
        ValueError: Naming the argument, its value and the accepted values.
    """
    check_choice('variant', variant, VARIANTS)
    solver = canonical_solver(solver)
    check_choice('solver', solver, SOLVERS)
    return solver


NewtonIterations = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def scaled_both_sides(mat: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(scale) . mat . diag(scale)`` (SOFT++'s ``D^-1/2 . middle . D^-1/2``).

    Args:
        mat (Tensor): Shape (..., m, m).
        scale (Tensor): Shape (..., m).

    Returns:
        Tensor: Shape (..., m, m).
    """
    return scale.unsqueeze(-1) * mat * scale.unsqueeze(-2)


def solve_kernel_inverse(mat: torch.Tensor, variant: str, solver: str,
                         num_iters: int, iterate: NewtonIterations) -> torch.Tensor:
    """:func:`kernel_inverse` with the Newton iteration ``iterate``.

    Args:
        mat (Tensor): Symmetric kernel matrices A, (B, ..., m, m).
        variant (str): ``'soft'`` or ``'soft++'``.
        solver (str): One of :data:`SOLVERS`.
        num_iters (int): Newton steps.
        iterate (callable): ``iterate(P, alpha, k)`` computes the iteration:
            :func:`~mmsoft.models.ops.newton.newton_iterations` or an
            implementation of the same function.

    Returns:
        Tensor: (B, ..., m, m), float32 for half or bfloat16 ``mat``, else
        the dtype of ``mat``.
    """
    variant = inverse_formula(variant, mat.shape[-1])
    with torch.autocast(device_type=mat.device.type, enabled=False):
        mat = full_precision(mat)
        if solver == 'exact':
            return _ExactInverse.apply(mat, variant)
        with torch.no_grad():
            alpha = newton_scale(mat, variant)  # a step size: (B, ..., 1, 1)
        operand = newton_operand(mat, variant)  # P: (B, ..., m, m)
        if solver_that_runs(solver, mat.device.type) == 'newton_closed_form':
            return newton_closed_form(operand, alpha, num_iters)
        return iterate(operand, alpha, num_iters)


def kernel_inverse(mat: torch.Tensor, variant: str = 'soft', solver: str = 'newton',
                   num_iters: int = 20) -> torch.Tensor:
    """Inverse of bottleneck kernel matrices, differentiable.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (B, ..., m, m); the
            leading dimension indexes images.
        variant (str): ``'soft'`` for ``(A + 0.01 I)^-1`` or ``'soft++'``
            for ``pinv(A)`` (of at least :data:`MIN_PSEUDO_INVERSE_TOKENS`
            tokens, see :func:`inverse_formula`). Default: ``'soft'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``,
            as :func:`check_kernel_inverse_options` returns it. Default:
            ``'newton'``.
        num_iters (int): Newton steps (``'newton'`` and
            ``'newton_closed_form'``). Default: 20.

    Returns:
        Tensor: Shape (B, ..., m, m), float32 for half or bfloat16 ``mat``
        (under autocast or not), else the dtype of ``mat``.
    """
    return solve_kernel_inverse(mat, variant, solver, num_iters, newton_iterations)
