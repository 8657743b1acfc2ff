"""An identity whose backward hands on a contiguous gradient."""
import torch

from ..tracing import records_forward_only


class ContiguousGradient(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def contiguous_gradient(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, whose gradient reaches the layers before it
    contiguous whatever layout the layers after it give.

    Where a layout-changing view (a transpose back from channels-first
    maps) would hand a kernel a strided gradient: torch 2.1's GELU backward
    reads it wrongly, and the compiler's stride model of
    ``native_layer_norm_backward`` differs from the CPU kernel's for it.

    Args:
        tensor (Tensor): Any shape.

    Returns:
        Tensor: ``tensor``'s values, as a view; ``tensor`` itself where no
        gradient is recorded or a forward-only tracer records
        (:func:`~mmsoft.models.tracing.records_forward_only`).
    """
    if tensor.requires_grad and not records_forward_only():
        return ContiguousGradient.apply(tensor)
    return tensor
