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
impossible where it is zero, so :func:`rebuilds_input` refuses a norm with
any ``|gamma| < MIN_ABS_WEIGHT`` (or with parameters in another dtype than
the norm computes in); the layer then runs autograd's LayerNorm (correct,
keeping its input).
"""
from typing import Optional

import torch

from ..layers.shared.precision import (apply_without_autocast, autocast_dtype,
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
    if weight is not None:  # in place on out - bias, a fresh tensor
        normalised = (normalised.div_(weight) if bias is not None
                      else normalised / weight)
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


def rebuilds_input(x: torch.Tensor, weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor]) -> bool:
    """Whether :func:`layer_norm_from_output` can run the norm on ``x``:
    its parameters have the dtype the norm computes in (float32 under
    autocast, else that of ``x``) and gamma can be divided out (every
    ``|weight| >= MIN_ABS_WEIGHT``)."""
    params = [p for p in (weight, bias) if p is not None]
    autocast = autocast_dtype(x.device.type) is not None
    dtype = full_precision(x).dtype if autocast else x.dtype
    if any(p.dtype != dtype for p in params):
        return False
    return weight is None or bool(weight.detach().abs().min() >= MIN_ABS_WEIGHT)
