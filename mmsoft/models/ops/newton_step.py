"""One step of the Newton–Schulz iteration towards a matrix inverse."""
import torch

from .float32_matmul import float32_matmul


def newton_step(inverse: torch.Tensor, operand: torch.Tensor) -> torch.Tensor:
    """``V <- 2V - (V P) V``, at float32 accuracy under TF32 matmuls too
    (:func:`~mmsoft.models.ops.float32_matmul.float32_matmul`).

    Args:
        inverse (Tensor): V, (..., m, m).
        operand (Tensor): P, (..., m, m).

    Returns:
        Tensor: The next V, (..., m, m).
    """
    return 2 * inverse - float32_matmul(float32_matmul(inverse, operand), inverse)
