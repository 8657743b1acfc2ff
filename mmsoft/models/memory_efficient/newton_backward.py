"""SOFT's kernel inverse whose Newton iteration keeps its operand alone.

:class:`_NewtonIterations` runs
:func:`~mmsoft.models.ops.newton.newton_iterations` without a graph and keeps
P and the step size ``alpha``; its backward recomputes the iterates
(:func:`~mmsoft.models.ops.newton.newton_iterates`) and runs reverse mode
through the steps by hand (:func:`newton_iterations_backward`).
:func:`kernel_inverse` is :func:`~mmsoft.models.ops.kernel_inverse.kernel_inverse`
with that iteration.
"""
from itertools import islice

import torch

from ..ops.float32_matmul import float32_matmul
from ..ops.kernel_inverse import solve_kernel_inverse
from ..ops.newton import newton_iterates, newton_iterations
from ..ops.precision import apply_without_autocast, backward_without_autocast


def newton_iterations_backward(operand: torch.Tensor, alpha: torch.Tensor,
                               num_iters: int,
                               grad_output: torch.Tensor) -> torch.Tensor:
    """``dL/dP`` of ``V_k = newton_iterations(P, alpha, k)``, exactly.

    Reverse mode through ``V_{j+1} = 2 V_j - (V_j P) V_j`` with
    ``G_{j+1} = dL/dV_{j+1}`` and ``W = G_{j+1} V_j^T``:
    ``G_j = 2 G_{j+1} - W P^T - (V_j P)^T G_{j+1}`` and
    ``dL/dP += -V_j^T W``; at the start, ``dL/dP += alpha G_0``. ``alpha`` is
    a constant.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.
        grad_output (Tensor): ``dL/dV_k``, (..., m, m).

    Returns:
        Tensor: ``dL/dP``, (..., m, m).
    """
    # (V_j, V_j P) for j < k; V_k itself is not computed.
    steps = list(islice(newton_iterates(operand, alpha, num_iters), num_iters))
    grad = grad_output  # G_k
    grad_operand = torch.zeros_like(operand)
    operand_t = operand.transpose(-1, -2)
    for inverse, product in reversed(steps):
        weighted = float32_matmul(grad, inverse.transpose(-1, -2))  # W: (..., m, m)
        grad_operand -= float32_matmul(inverse.transpose(-1, -2), weighted)
        grad = (2 * grad - float32_matmul(weighted, operand_t)
                - float32_matmul(product.transpose(-1, -2), grad))  # G_j
    return grad_operand + alpha * grad


class _NewtonIterations(torch.autograd.Function):
    """``V_k(P)`` by the iteration, without a graph; backward is its exact
    derivative (:func:`newton_iterations_backward`). Keeps P and alpha only."""

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
    """:func:`~mmsoft.models.ops.newton.newton_iterations`, differentiable in
    P, keeping P alone for backward (``alpha`` is a constant).

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.

    Returns:
        Tensor: (..., m, m), float32 or float64 (also under autocast).
    """
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonIterations, operand, alpha, num_iters)


def kernel_inverse(mat: torch.Tensor, variant: str = 'soft', solver: str = 'newton',
                   num_iters: int = 20) -> torch.Tensor:
    """:func:`~mmsoft.models.ops.kernel_inverse.kernel_inverse` (same
    arguments, values and gradients) whose ``'newton'`` solver runs
    :func:`recomputed_newton_iterations`.

    Args:
        mat (Tensor): Symmetric kernel matrices A, shape (B, ..., m, m).
        variant (str): ``'soft'`` or ``'soft++'``. Default: ``'soft'``.
        solver (str): ``'newton'``, ``'newton_closed_form'`` or ``'exact'``.
            Default: ``'newton'``.
        num_iters (int): Newton steps. Default: 20.

    Returns:
        Tensor: Shape (B, ..., m, m).
    """
    return solve_kernel_inverse(mat, variant, solver, num_iters,
                                recomputed_newton_iterations)
