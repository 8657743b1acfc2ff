"""Inverses of the bottleneck kernel matrix used by SOFT attention.

Two variants exist (see ``docs`` of :class:`~mmsoft.models.layers.SoftAttention`):

* ``'soft'``: the regularised inverse ``(A + 0.01 I)^-1``.
* ``'soft++'``: the Moore-Penrose pseudo-inverse ``pinv(A)`` (no regulariser).

and two solvers:

* ``'newton'``: the Newton-Raphson iteration ``V <- 2V - V P V`` of the reference
  implementation. Its initial scaling is computed per matrix for SOFT (as the
  reference does) and per image for SOFT++ (the reference uses one scaling
  for the whole batch, which makes an image's features depend on its
  batch-mates; per image it equals the reference at batch size 1).
* ``'cholesky'``: an exact solve. ``A + 0.01 I`` is symmetric positive definite,
  so a Cholesky factorisation gives the limit of the regularised Newton
  iteration at a fraction of the cost. For ``'soft++'`` an eigendecomposition
  gives a stable exact pseudo-inverse.

All forward computations run without an autograd graph and in float32 (or
float64 when given); the backward pass is the exact gradient of a matrix
inverse, ``dL/dA = -V^T G V^T``, computed once.
"""
import torch

REGULARISER = 0.01
VARIANTS = ('soft', 'soft++')
SOLVERS = ('newton', 'cholesky')


def _eye_like(mat: torch.Tensor) -> torch.Tensor:
    return torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)


def _newton_iterations(mat: torch.Tensor, init: torch.Tensor,
                       num_iters: int) -> torch.Tensor:
    """Runs ``V <- 2V - V P V``. mat, init: (..., m, m)."""
    inv = init
    for _ in range(num_iters):
        inv = 2 * inv - inv @ mat @ inv
    return inv


def newton_regularised_inverse(mat: torch.Tensor, num_iters: int = 20) -> torch.Tensor:
    """Newton-Raphson approximation of ``(A + 0.01 I)^-1`` (SOFT).

    The initial guess is ``alpha * P`` with ``alpha = 0.9 * 2 / (max row sum
    of A)^2`` for each matrix, as in the reference implementation.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (..., m, m).
        num_iters (int): Number of iterations. Default: 20.

    Returns:
        Tensor: Shape (..., m, m).
    """
    max_row_sum = mat.sum(-1).amax(-1)  # (...)
    alpha = (0.9 * 2 / max_row_sum.pow(2))[..., None, None]
    regularised = mat + REGULARISER * _eye_like(mat)
    return _newton_iterations(regularised, alpha * regularised, num_iters)


def _per_image_max(values: torch.Tensor) -> torch.Tensor:
    """Max over all but the first dimension, broadcastable to (B, ..., 1, 1).

    values: (B, ...) -> (B, 1, ..., 1) with the rank of ``values`` plus one.
    """
    if values.dim() <= 1:
        return values.amax().reshape(*([1] * (values.dim() + 1)))
    peak = values.flatten(1).amax(1)  # (B, )
    return peak.reshape(-1, *([1] * values.dim()))


def newton_pseudo_inverse(mat: torch.Tensor, num_iters: int = 20,
                          max_halvings: int = 10) -> torch.Tensor:
    """Newton-Raphson approximation of ``pinv(A)`` (SOFT++).

    Initial guess ``V0 = alpha * A`` with ``alpha = 2 / (max row sum)^2``,
    halved while the column-sum norm of ``I - A V0`` exceeds 1.01 (at most
    ``max_halvings`` times). As in the reference, one ``alpha`` serves all the
    heads of an image (maximum over heads and rows), which matters: after 20
    iterations the small-eigenvalue directions have not converged, so
    ``alpha`` shapes the result. Unlike the reference, whose ``alpha`` spans
    the whole batch, it is taken per image (the first dimension), so an
    image's features do not depend on its batch-mates.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (B, ..., m, m); the
            leading dimension indexes images.
        num_iters (int): Number of iterations. Default: 20.
        max_halvings (int): Most halvings of the initial scale. Default: 10.

    Returns:
        Tensor: Shape (B, ..., m, m).
    """
    eye = _eye_like(mat)
    alpha = 2 / _per_image_max(mat.sum(-1)).pow(2)  # (B, 1, ..., 1)
    for _ in range(max_halvings):
        residual = (eye - mat @ (alpha * mat)).abs().sum(-2)  # (B, ..., m)
        too_large = _per_image_max(residual) > 1.01  # (B, 1, ..., 1)
        if not bool(too_large.any()):
            break
        alpha = torch.where(too_large, alpha * 0.5, alpha)
    return _newton_iterations(mat, alpha * mat, num_iters)


def cholesky_regularised_inverse(mat: torch.Tensor) -> torch.Tensor:
    """Exact ``(A + 0.01 I)^-1`` through a Cholesky factorisation.

    Args:
        mat (Tensor): Symmetric positive semi-definite matrices, (..., m, m).

    Returns:
        Tensor: Shape (..., m, m).
    """
    factor = torch.linalg.cholesky(mat + REGULARISER * _eye_like(mat))
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


def solve_kernel_inverse(mat: torch.Tensor, variant: str, solver: str,
                         num_iters: int = 20) -> torch.Tensor:
    """Dispatches to the inverse of ``variant`` computed by ``solver``."""
    if variant == 'soft':
        if solver == 'newton':
            return newton_regularised_inverse(mat, num_iters)
        return cholesky_regularised_inverse(mat)
    if solver == 'newton':
        return newton_pseudo_inverse(mat, num_iters)
    return eigh_pseudo_inverse(mat)


class _KernelInverse(torch.autograd.Function):
    """Inverse computed without a graph; backward is that of a matrix inverse."""

    @staticmethod
    def forward(ctx, mat, variant, solver, num_iters):
        with torch.no_grad():
            inverse = solve_kernel_inverse(mat, variant, solver, num_iters)
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    def backward(ctx, grad_output):
        inverse, = ctx.saved_tensors
        inverse_t = inverse.transpose(-1, -2)
        grad_mat = -(inverse_t @ grad_output @ inverse_t)
        return grad_mat, None, None, None


def kernel_inverse(mat: torch.Tensor, variant: str = 'soft',
                   solver: str = 'newton', num_iters: int = 20) -> torch.Tensor:
    """Inverse of bottleneck kernel matrices with the exact inverse gradient.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (..., m, m).
        variant (str): ``'soft'`` for ``(A + 0.01 I)^-1`` or ``'soft++'`` for
            ``pinv(A)``. Default: ``'soft'``.
        solver (str): ``'newton'`` or ``'cholesky'``. Default: ``'newton'``.
        num_iters (int): Newton iterations. Default: 20.

    Returns:
        Tensor: Shape (..., m, m), same dtype as ``mat``.
    """
    if variant not in VARIANTS:
        raise ValueError(f'variant={variant!r} is not supported; expected one of '
                         f'{list(VARIANTS)}.')
    if solver not in SOLVERS:
        raise ValueError(f'solver={solver!r} is not supported; expected one of '
                         f'{list(SOLVERS)}.')
    return _KernelInverse.apply(mat, variant, solver, num_iters)
