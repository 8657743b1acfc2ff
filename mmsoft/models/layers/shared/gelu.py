"""The exact GELU, with a correct backward on every supported torch.

On torch 2.1's CPU kernel, the backward of ``F.gelu`` reads a gradient laid
out unlike its input (a transposed one, as the kernels of SOFT attention
return) with the input's strides: wrong values in float32, NaN in bfloat16
(:data:`~mmsoft.utils.torch_compat.GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT`
detects it at import). There, :func:`gelu` hands the backward a contiguous
gradient (:mod:`.contiguous_gradient`); elsewhere it is ``F.gelu``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ....utils.torch_compat import GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT
from ...ops.contiguous_gradient import contiguous_gradient


def gelu(tensor: torch.Tensor) -> torch.Tensor:
    """``F.gelu(tensor)`` (exact), with the gradient its backward receives
    made contiguous where torch's kernel needs it.

    Args:
        tensor (Tensor): Any shape.

    Returns:
        Tensor: The same shape.
    """
    out = F.gelu(tensor)
    if GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT:
        out = contiguous_gradient(out)
    return out


class GELU(nn.GELU):
    """``nn.GELU()`` (exact) through :func:`gelu`."""

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return gelu(tensor)
