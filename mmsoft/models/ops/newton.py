"""The Newton-Schulz iteration towards a matrix inverse.

``V_{j+1} = 2 V_j - (V_j P) V_j`` from ``V_0 = alpha * P``. Every product
is at float32 accuracy under TF32 matmuls too
(:func:`~mmsoft.models.ops.float32_matmul.float32_matmul`).
"""
from typing import Iterator, Optional, Tuple

import torch

from .float32_matmul import float32_matmul


def newton_iterates(operand: torch.Tensor, alpha: torch.Tensor, num_iters: int
                    ) -> Iterator[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """The iterates of ``num_iters`` Newton steps, each with its product.

    Each step is computed when the next item is asked for.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.

    Yields:
        tuple[Tensor, Tensor | None]: ``(V_j, V_j P)`` for ``j < k``, then
        ``(V_k, None)``; each (..., m, m).
    """
    inverse = alpha * operand  # V_0
    for _ in range(num_iters):
        product = float32_matmul(inverse, operand)  # V_j P
        yield inverse, product
        inverse = 2 * inverse - float32_matmul(product, inverse)  # V_{j+1}
    yield inverse, None


def newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                      num_iters: int) -> torch.Tensor:
    """``V_k``: ``num_iters`` steps of ``V <- 2V - (V P) V`` from ``V0 = alpha P``.

    Args:
        operand (Tensor): P, (..., m, m).
        alpha (Tensor): Scales broadcastable to P, (..., 1, 1).
        num_iters (int): Steps k.

    Returns:
        Tensor: (..., m, m).
    """
    for inverse, _ in newton_iterates(operand, alpha, num_iters):
        pass
    return inverse

