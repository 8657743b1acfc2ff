"""BatchNorm -> activation -> convolution whose backward recomputes the middle.

In a convolutional stem ``conv -> BN -> act -> conv -> BN -> act ...``
autograd keeps, per layer, BatchNorm's input, the activation's output (or
input) and the next convolution's input: two or three maps at the layer's
resolution, the largest tensors of a backbone at detection size. Here one
autograd function spans ``BN -> act -> conv`` (or ``BN -> act`` at the end of
the stack) and keeps only BatchNorm's input: backward recomputes the
normalised, activated map (element-wise, plus BatchNorm's per-channel
statistics) and hands it to the convolution's own backward, so no
convolution runs twice.

BatchNorm's running statistics are updated once, by the forward pass; the
recomputation normalises with the statistics the forward pass used (the
batch's in training, the running ones in eval mode).

Under autocast, BatchNorm and the activation run in float32 (on the kept
input, whatever its dtype) and the convolution in autocast's dtype, which is
also the output's.

:func:`fused_conv_stack` runs a whole stack (a convolutional stem, the
feature pyramid's upsampling branch) this way: every ``BN -> act (-> conv)``
it can fuse (:func:`fusable`) as :func:`norm_act_conv`, the other layers as
they are.
"""
from functools import partial
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.precision import (AUTOCAST_CASTABLE, apply_without_autocast,
                                       autocast_dtype, backward_without_autocast,
                                       cast_floating, full_precision)
from ..ops.valid_region import (ValidShapes, mask_map, strided_shapes,
                                          valid_mask)
from .recompute import recomputes_locally

CONVOLUTIONS = (nn.Conv2d, nn.ConvTranspose2d)


def normalise_like_forward(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the statistics its forward pass uses, updating none."""
    batch_stats = norm.training or not norm.track_running_stats
    return F.batch_norm(x, None if batch_stats else norm.running_mean,
                        None if batch_stats else norm.running_var, norm.weight,
                        norm.bias, training=batch_stats, eps=norm.eps)


def _activated(normalise: Callable[[torch.Tensor], torch.Tensor], act: nn.Module,
               x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``act(normalise(x))``, zero where ``mask`` (B, 1, H, W) is False."""
    hidden = act(normalise(x))
    return hidden if mask is None else hidden.masked_fill(~mask, 0.)


def norm_input(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` in the dtype BatchNorm computes in: that of its parameters
    (float32 under autocast, whatever the dtype of ``x``)."""
    if norm.weight is None:
        return full_precision(x)
    return x.to(norm.weight.dtype)


def convolution(conv: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``conv(x)`` with the given weight and bias (Conv2d or
    ConvTranspose2d, zero padding), the call :func:`convolution_backward`
    differentiates."""
    transposed = isinstance(conv, nn.ConvTranspose2d)
    output_padding = conv.output_padding if transposed else (0, 0)
    return torch.convolution(x, weight, bias, conv.stride, conv.padding,
                             conv.dilation, transposed, output_padding, conv.groups)


class NormActConv(torch.autograd.Function):
    """Autograd function of :func:`norm_act_conv`."""

    @staticmethod
    def forward(ctx, x, mask, norm_weight, norm_bias, conv_weight, conv_bias, layers,
                out_dtype):
        norm, act, conv = layers
        # Updates the running statistics once.
        hidden = _activated(norm, act, norm_input(norm, x), mask).to(out_dtype)
        ctx.save_for_backward(x, mask, conv_weight)
        ctx.layers = layers
        ctx.out_dtype = out_dtype
        if conv is None:
            return hidden
        return convolution(conv, hidden, conv_weight, conv_bias)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        x, mask, conv_weight = ctx.saved_tensors
        norm, act, conv = ctx.layers
        input_dtype = x.dtype
        with torch.enable_grad():
            x = norm_input(norm, x.detach()).requires_grad_()
            hidden = _activated(partial(normalise_like_forward, norm), act, x,
                                mask).to(ctx.out_dtype)  # (B, C, H, W)
        grad_conv_weight = grad_conv_bias = None
        if conv is None:
            grad_hidden = grad_out
        else:
            grad_hidden, grad_conv_weight, grad_conv_bias = convolution_backward(
                conv, grad_out, hidden.detach(), conv_weight, ctx.needs_input_grad[4:6])
        params = [p for p in (norm.weight, norm.bias) if p is not None]
        grads = torch.autograd.grad(hidden, [x] + params, grad_hidden)
        grad_norm_weight, grad_norm_bias = (grads[1:] if params else (None, None))
        return (grads[0].to(input_dtype), None, grad_norm_weight, grad_norm_bias,
                grad_conv_weight, grad_conv_bias, None, None)


def convolution_backward(conv: nn.Module, grad_out: torch.Tensor,
                         inputs: torch.Tensor, weight: torch.Tensor,
                         needs_grad: Sequence[bool]):
    """Gradients of ``conv`` at ``inputs`` without running it again.

    Returns:
        tuple: Gradients of the input, the weight and the bias (None for
        those not needed).
    """
    transposed = isinstance(conv, nn.ConvTranspose2d)
    bias_sizes = None if conv.bias is None else [conv.bias.shape[0]]
    output_padding = conv.output_padding if transposed else (0, 0)
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad_out, inputs, weight, bias_sizes, conv.stride, conv.padding,
        conv.dilation, transposed, output_padding, conv.groups,
        [True, needs_grad[0], needs_grad[1] and conv.bias is not None])
    return grad_input, grad_weight, grad_bias


def norm_act_conv(x: torch.Tensor, norm: nn.BatchNorm2d, act: nn.Module,
                  conv: Optional[nn.Module] = None,
                  mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``conv(act(norm(x)) * mask)`` keeping only ``x`` for backward.

    Args:
        x (Tensor): BatchNorm's input, shape (B, C, H, W).
        norm (nn.BatchNorm2d): The BatchNorm.
        act (nn.Module): Element-wise activation without parameters.
        conv (nn.Module, optional): Conv2d or ConvTranspose2d after the
            activation (zero padding). None ends at the activation.
        mask (Tensor, optional): (B, 1, H, W) bool, False where the
            activated map is zeroed before ``conv``. Default: None.

    Returns:
        Tensor: The convolution's (or the activation's) output, in
        autocast's dtype under autocast, else in the dtype of ``x``.
    """
    low = autocast_dtype(x.device.type)
    out_dtype = low if low is not None and x.dtype in AUTOCAST_CASTABLE else x.dtype
    conv_weight = None if conv is None else cast_floating(conv.weight, out_dtype)
    conv_bias = None if conv is None else cast_floating(conv.bias, out_dtype)
    return apply_without_autocast(NormActConv, x, mask, norm.weight, norm.bias,
                                  conv_weight, conv_bias, (norm, act, conv),
                                  out_dtype, cast_to=None)


def fusable(layers: Sequence[nn.Module], index: int) -> bool:
    """Whether ``layers[index:]`` starts with a plain BatchNorm2d and an
    activation without parameters (SyncBatchNorm and others are not:
    their statistics cannot be recomputed locally)."""
    return (index + 1 < len(layers) and recomputes_locally(layers[index])
            and not isinstance(layers[index + 1], (nn.BatchNorm2d, *CONVOLUTIONS))
            and not any(True for _ in layers[index + 1].parameters()))


def _zero_padded(conv: Optional[nn.Module]) -> bool:
    return conv is None or getattr(conv, 'padding_mode', 'zeros') == 'zeros'


def fused_conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
                     valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """A stack of convolutions, BatchNorms and activations, each fusable
    ``BN -> act (-> conv)`` run as :func:`norm_act_conv`.

    The same outputs as running the layers one after the other: with
    ``valid_shapes``, every Conv2d sees zeros outside the regions (which it
    maps through its stride) and the output is zero outside them.

    Args:
        layers (Sequence[nn.Module]): The stack (e.g. an ``nn.Sequential``).
        x (Tensor): Shape (B, C, H, W).
        valid_shapes (list[tuple[int, int]], optional): Regions of the
            input grid; only for stacks of Conv2d. Default: None.

    Returns:
        Tensor: The last layer's output.
    """
    layers: List[nn.Module] = list(layers)
    index = 0
    while index < len(layers):
        layer = layers[index]
        following = layers[index + 2] if index + 2 < len(layers) else None
        if not isinstance(following, CONVOLUTIONS):
            following = None
        if fusable(layers, index) and _zero_padded(following):
            mask = None
            if following is not None and valid_shapes is not None:
                mask = valid_mask(valid_shapes, x.shape[-2:], x.device)[:, None]
            x = norm_act_conv(x, layer, layers[index + 1], following, mask)
            index += 2
            layer = following
            if layer is None:
                continue
        elif isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, valid_shapes))
        else:
            x = layer(x)
        if isinstance(layer, nn.Conv2d) and valid_shapes is not None:
            valid_shapes = strided_shapes(valid_shapes, layer.stride[:1])
        index += 1
    return mask_map(x, valid_shapes)
