"""A LayerNorm and the layer that reads it, keeping the LayerNorm's input alone.

``y = LN(x) = gamma x^ + beta``, ``x^ = (x - mean) / sigma``, then an MLP
(:func:`layer_norm_mlp`) or a Linear layer (:func:`layer_norm_linear`). Plain
autograd keeps x for the LayerNorm and y for the next layer; the training
implementations keep x (with its mean and 1/sigma), and recompute y (and the
MLP's activation) in backward. Tracers and ``torch.compile`` record the plain
formulas (the compiler plans the memory itself). A layer scale s multiplies the output
(``s o fc2(...)``) without keeping it: ``ds = rowsum(W o G^T h) + b o
colsum(G)`` comes from the product the weight's gradient needs.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._library import (autocast_dtype, autocast_off,
                       backward_without_autocast, cast_floating, is_tracing)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1])


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """``y = gamma x^ + beta`` (..., C) with its mean and 1/sigma (..., 1)."""
    return torch.native_layer_norm(x, (x.shape[-1], ), weight, bias, eps)


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """The gradients of x, gamma and beta of :func:`layer_norm` from dy."""
    return torch.ops.aten.native_layer_norm_backward(
        grad, x, x.shape[-1:], mean, rstd, weight, bias, [True, True, True])


def linear_backward(grad: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor], scale: Optional[torch.Tensor],
                    needs_bias: bool):
    """The gradients of the input, W, b and s of ``s o (inputs W^T + b)``: with
    ``M = G^T inputs``, ``dW = s o M``, ``db = s o colsum(G)``, ``ds = rowsum(W
    o M) + b o colsum(G)``, ``d inputs = (s o G) W``. The products run in the
    weight's dtype, as autocast runs the layer's; s stays in its own."""
    low = weight.dtype
    flat_grad = _flat(grad)
    product = flat_grad.to(low).transpose(0, 1) @ _flat(inputs)  # M: (C_out, C_in)
    column_sums = flat_grad.sum(0) if needs_bias or scale is not None else None
    if scale is None:
        return grad.to(low) @ weight, product, column_sums if needs_bias else None, None

    # rowsum(W o M) as a batch of (1, C_in) x (C_in, 1) products: one kernel
    grad_scale = (weight.unsqueeze(1) @ product.unsqueeze(2)).view(-1).to(scale.dtype)
    if bias is not None:
        grad_scale = torch.addcmul(grad_scale, bias, column_sums)
    grad_bias = scale * column_sums if needs_bias else None
    return ((grad * scale).to(low) @ weight, scale[:, None] * product, grad_bias,
            grad_scale)


def mlp_backward(act: nn.Module, y, pre, weight1, bias1, weight2, bias2, scale,
                 grad_out, needs_bias2: bool):
    """The gradients of y, W1, b1, W2, b2 and s of ``s o fc2(act(h))``, ``h =
    fc1(y)`` (``pre``, recomputed when None): fc2's by :func:`linear_backward`,
    ``dh = act'(h) o dg``, ``dW1 = dh^T y``, ``dy = dh W1``. Of the hidden-size
    tensors, only dh is live at the last product, and none after the call."""
    if pre is None:
        pre = F.linear(y, weight1, bias1)
    with torch.enable_grad():
        pre = pre.detach().requires_grad_()
        hidden = act(pre)  # g = act(h): (..., hidden)
    grad_hidden, grad_weight2, grad_bias2, grad_scale = linear_backward(
        grad_out, hidden.detach(), weight2, bias2, scale, needs_bias2)
    grad_pre, = torch.autograd.grad(hidden, pre, grad_hidden)  # dh: (..., hidden)
    del hidden, grad_hidden
    grad_weight1 = _flat(grad_pre).transpose(0, 1) @ _flat(y)
    grad_bias1 = None if bias1 is None else _flat(grad_pre).sum(0)
    return (grad_pre @ weight1, grad_weight1, grad_bias1, grad_weight2, grad_bias2,
            grad_scale)


def _scaled(out: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    return out if scale is None else out * scale


class LayerNormMLP(torch.autograd.Function):
    """``y = norm(x)`` and ``s o mlp(y)``, keeping x, its mean and 1/sigma.

    Backward, with y recomputed, ``h = fc1(y)`` (kept, or recomputed unless
    ``keep_hidden``) and ``g = act(h)`` recomputed: :func:`mlp_backward`, then
    :func:`layer_norm_backward`.
    """

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight1, bias1, weight2, bias2,
                scale, act, keep_hidden):
        y, mean, rstd = layer_norm(x, norm_weight, norm_bias, eps)  # (..., C)
        pre = F.linear(y.to(weight1.dtype), weight1, bias1)  # (..., hidden)
        ctx.save_for_backward(x, mean, rstd, pre if keep_hidden else None,
                              norm_weight, norm_bias, weight1, bias1, weight2, bias2,
                              scale)
        ctx.act, ctx.eps = act, eps
        ctx.set_materialize_grads(False)  # y's gradient is None where y is unused
        return y, _scaled(F.linear(act(pre), weight2, bias2), scale)  # scale's dtype

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_y, grad_out):
        (x, mean, rstd, pre, norm_weight, norm_bias, weight1, bias1, weight2, bias2,
         scale) = ctx.saved_tensors
        grads = (None, ) * 6
        if grad_out is not None:
            y = layer_norm(x, norm_weight, norm_bias, ctx.eps)[0].to(weight1.dtype)
            grads = mlp_backward(ctx.act, y, pre, weight1, bias1, weight2, bias2, scale,
                                 grad_out, ctx.needs_input_grad[7])
            grad_y = grads[0].to(x.dtype) if grad_y is None else grad_y + grads[0]
        if grad_y is None:
            return (None, ) * 11

        grad_x, grad_norm_weight, grad_norm_bias = layer_norm_backward(
            grad_y, x, mean, rstd, norm_weight, norm_bias)
        return (grad_x, grad_norm_weight, grad_norm_bias, None, *grads[1:], None, None)


def _mixed_precision_args(x: torch.Tensor, norm: Optional[nn.LayerNorm], layers):
    """The LayerNorm's arguments (x first) in float32 and the layers' weights
    and biases in autocast's dtype (as autocast casts them), with autocast on;
    as they are without."""
    norm_args = [x] if norm is None else [x, norm.weight, norm.bias]
    layer_args = [tensor for layer in layers for tensor in (layer.weight, layer.bias)]
    low = autocast_dtype(x.device.type)
    if low is not None:
        norm_args = [cast_floating(arg, low if norm is None else torch.float32)
                     for arg in norm_args]
        layer_args = [cast_floating(arg, low) for arg in layer_args]
    return norm_args, layer_args


def layer_norm_mlp(x: torch.Tensor, norm: nn.LayerNorm, mlp: nn.Module,
                   layer_scale: Optional[torch.Tensor] = None, fused: bool = True
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``y = norm(x)`` and ``layer_scale * mlp(y)``; ``fused``: keeping only x^
    and 1/sigma (:class:`LayerNormMLP`).

    With dropout active, plain autograd runs. Returns ``y`` in float32 under
    autocast (as LayerNorm) and ``mlp(y)`` in autocast's dtype.
    """
    if not fused or is_tracing() or (mlp.training and mlp.drop.p > 0):
        y = norm(x)
        return y, _scaled(mlp(y), layer_scale)

    norm_args, layer_args = _mixed_precision_args(x, norm, (mlp.fc1, mlp.fc2))
    with autocast_off(x.device.type):
        return LayerNormMLP.apply(*norm_args, norm.eps, *layer_args, layer_scale,
                                  mlp.act, mlp.keep_hidden)


class LayerNormLinear(torch.autograd.Function):
    """``linear(norm(x))``, keeping x, its mean and 1/sigma; backward recomputes
    ``y = norm(x)``: ``dW = G^T y``, ``db = colsum(G)``, ``dy = G W``, then
    :func:`layer_norm_backward`."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight, bias):
        y, mean, rstd = layer_norm(x, norm_weight, norm_bias, eps)  # (..., C)
        ctx.save_for_backward(x, mean, rstd, norm_weight, norm_bias, weight)
        ctx.has_bias, ctx.eps = bias is not None, eps
        return F.linear(y.to(weight.dtype), weight, bias)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        x, mean, rstd, norm_weight, norm_bias, weight = ctx.saved_tensors
        y = layer_norm(x, norm_weight, norm_bias, ctx.eps)[0].to(weight.dtype)
        grad_y, grad_weight, grad_bias, _ = linear_backward(
            grad_out, y, weight, None, None, ctx.has_bias and ctx.needs_input_grad[5])
        grad_x, grad_norm_weight, grad_norm_bias = layer_norm_backward(
            grad_y.to(x.dtype), x, mean, rstd, norm_weight, norm_bias)
        return grad_x, grad_norm_weight, grad_norm_bias, None, grad_weight, grad_bias


def layer_norm_linear(x: torch.Tensor, norm: nn.LayerNorm, linear: nn.Linear,
                      fused: bool = True) -> torch.Tensor:
    """``linear(norm(x))``; ``fused``: keeping only x^ and 1/sigma
    (:class:`LayerNormLinear`). In autocast's dtype under autocast."""
    if not fused or is_tracing():
        return linear(norm(x))
    norm_args, layer_args = _mixed_precision_args(x, norm, (linear, ))
    with autocast_off(x.device.type):
        return LayerNormLinear.apply(*norm_args, norm.eps, *layer_args)


class ScaledLinear(torch.autograd.Function):
    """``s o linear(x)``, keeping x alone; backward :func:`linear_backward`."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale):
        ctx.save_for_backward(x, weight, bias, scale)
        return F.linear(x, weight, bias) * scale

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        x, weight, bias, scale = ctx.saved_tensors
        grad_x, grad_weight, grad_bias, grad_scale = linear_backward(
            grad_out, x, weight, bias, scale,
            bias is not None and ctx.needs_input_grad[2])
        return grad_x, grad_weight, grad_bias, grad_scale


def scaled_linear(x: torch.Tensor, linear: nn.Linear, scale: torch.Tensor,
                  fused: bool = True) -> torch.Tensor:
    """``scale * linear(x)``; ``fused``: keeping only x (:class:`ScaledLinear`).
    Under autocast the Linear layer runs in autocast's dtype and the scale in
    its own, as autocast runs ``scale * linear(x)``."""
    if not fused or is_tracing():
        return scale * linear(x)
    (x, ), layer_args = _mixed_precision_args(x, None, (linear, ))
    with autocast_off(x.device.type):
        return ScaledLinear.apply(x, *layer_args, scale)
