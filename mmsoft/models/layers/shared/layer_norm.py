"""LayerNorm whose backward reads its output instead of its input.

Autograd's LayerNorm keeps its input x for backward. In a transformer block
the output y is kept anyway, by the Linear or convolution that consumes it,
so keeping x as well costs one token-width tensor per norm. Here forward
keeps y and the per-token mean and ``rstd`` only, and backward rebuilds the
input, ``x = x_hat / rstd + mean`` with ``x_hat = (y - beta) / gamma``, and
runs PyTorch's own LayerNorm backward on it: the same gradients, one
token-width tensor fewer per norm, in pre-norm blocks (x is the residual
stream, kept by nobody else) and in post-norm blocks (x is the residual sum)
alike. The rebuilt x is as precise as a stored float x would be.

Dividing by ``gamma`` loses precision where ``|gamma|`` is tiny and is
impossible where it is zero, so a norm with any ``|gamma| < MIN_ABS_WEIGHT``
falls back to autograd's LayerNorm (correct, keeping its input).
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .autograd_state import records_gradient
from .precision import (apply_without_autocast, autocast_dtype,
                        backward_without_autocast, full_precision)

MIN_ABS_WEIGHT = 1e-3


class LayerNormFromOutput(torch.autograd.Function):
    """Autograd function of :func:`layer_norm_from_output`."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        out, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)
        ctx.save_for_backward(out, weight, bias, mean, rstd)  # mean, rstd: (..., 1)
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        out, weight, bias, mean, rstd = ctx.saved_tensors
        x = input_from_output(out, weight, bias, mean, rstd)  # (..., C)
        grad_x, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grad_out, x, x.shape[-1:], mean, rstd, weight, bias,
            [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
             ctx.needs_input_grad[2]])
        return grad_x, grad_weight, grad_bias, None


def input_from_output(out: torch.Tensor, weight: Optional[torch.Tensor],
                      bias: Optional[torch.Tensor], mean: torch.Tensor,
                      rstd: torch.Tensor) -> torch.Tensor:
    """The LayerNorm input that gave ``out``: ``x_hat / rstd + mean`` with
    ``x_hat = (out - beta) / gamma``. Shapes (..., C), (C, ), (C, ),
    (..., 1), (..., 1) -> (..., C)."""
    normalised = out if bias is None else out - bias
    if weight is not None:
        normalised = normalised.div_(weight) if bias is not None else normalised / weight
    return torch.addcdiv(mean, normalised, rstd)


def layer_norm_from_output(x: torch.Tensor, weight: Optional[torch.Tensor],
                           bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """``F.layer_norm`` over the last dimension, keeping its output for backward.

    Args:
        x (Tensor): Shape (..., C).
        weight (Tensor, optional): gamma, shape (C, ), every entry nonzero.
        bias (Tensor, optional): beta, shape (C, ).
        eps (float): Added to the variance.

    Returns:
        Tensor: Shape (..., C); float32 under autocast, as autocast's
        LayerNorm.
    """
    return apply_without_autocast(LayerNormFromOutput, x, weight, bias, eps)


class LayerNormSavingOutput(nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` over the last dimension that keeps its
    output, not its input, for backward (see this module's docstring).

    Same parameters, state-dict keys and outputs as ``nn.LayerNorm``. The
    memory-saving function runs when autograd records and every
    ``|weight| >= MIN_ABS_WEIGHT``, in float32 under autocast; otherwise
    (inference, tracing, ONNX export, a near-zero gamma) the plain LayerNorm
    does.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., C)."""
        if len(self.normalized_shape) == 1 and self._backward_from_output(x):
            return layer_norm_from_output(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def _backward_from_output(self, x: torch.Tensor) -> bool:
        """Whether autograd records, the parameters have the dtype the norm
        computes in and gamma can be divided out."""
        params = [p for p in (self.weight, self.bias) if p is not None]
        autocast = autocast_dtype(x.device.type) is not None
        dtype = full_precision(x).dtype if autocast else x.dtype
        if (not records_gradient(x, *params)
                or any(p.dtype != dtype for p in params)):
            return False
        return self.weight is None or bool(self.weight.detach().abs().min()
                                           >= MIN_ABS_WEIGHT)
