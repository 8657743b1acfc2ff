"""The Newton iteration of SOFT's kernel inverse, keeping its operand alone.

:func:`~mmsoft.models.ops.kernel_inverse.newton_iterations` runs
``k`` steps of ``V <- 2V - (V P) V`` from ``V0 = alpha * P`` on the m x m
operand P. Under plain autograd every step keeps its iterate and its product
``V P`` for backward: ``2k`` m x m matrices per head. Here the iteration runs
inside one autograd function (:class:`_NewtonIterations`) that keeps P and
the step size ``alpha`` only; its backward recomputes the iterates
(:func:`newton_iterates`) and runs reverse mode through the ``k`` steps by
hand (:func:`newton_iterations_backward`): the exact derivative of the
iteration, the gradient plain autograd gives, for one more forward pass of
m x m products. ``alpha`` is a step size: no gradient flows through it.
"""
import torch

from ..ops.float32_matmul import float32_matmul
from ..ops.newton_step import newton_step
from ..ops.precision import apply_without_autocast, backward_without_autocast


def newton_iterates(operand: torch.Tensor, alpha: torch.Tensor,
                    num_iters: int) -> list:
    """The iterates backward differentiates at, with the product each step forms.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.

    Returns:
        list[tuple[Tensor, Tensor]]: ``[(V_0, V_0 P), ..., (V_{k-1}, V_{k-1} P)]``,
        each (..., m, m).
    """
    inverse = alpha * operand
    iterates = []
    for step in range(num_iters):
        product = float32_matmul(inverse, operand)  # V_j P
        iterates.append((inverse, product))
        if step + 1 < num_iters:
            inverse = 2 * inverse - float32_matmul(product, inverse)
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
        weighted = float32_matmul(grad, inverse.transpose(-1, -2))  # W, (..., m, m)
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
        inverse = alpha * operand
        for _ in range(num_iters):
            inverse = newton_step(inverse, operand)
        return inverse

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        operand, alpha = ctx.saved_tensors
        return (newton_iterations_backward(operand, alpha, ctx.num_iters,
                                           grad_output), None, None)


def recomputed_newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                                 num_iters: int) -> torch.Tensor:
    """``newton_iterations(P, alpha, k)``, differentiable in P at the cost of
    keeping P alone (``alpha`` is a constant).

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.

    Returns:
        Tensor: (..., m, m), float32 or float64 (also under autocast).
    """
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(_NewtonIterations, operand, alpha, num_iters)
