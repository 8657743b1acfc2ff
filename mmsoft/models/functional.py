"""Tensor functions both models share, in plain PyTorch.

Mixed precision, valid regions of padded batches, recomputation, and the
memory-saving autograd functions with their plain twins: the MLP
(``recomputed_mlp``, ``layer_norm_mlp``; plain: ``MLP.forward``) and the
BatchNorm-activation-convolution stack (``fused_conv_stack``; plain:
``conv_stack``).
"""
import functools
import threading
from contextlib import contextmanager
from functools import partial
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..utils.torch_compat import (GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT,
                                  autocast_dtype, autocast_off, is_compiling)


# --- Tracing
def records_forward_only() -> bool:
    """Whether ``torch.jit.trace`` or the ONNX exporter is recording."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def is_tracing() -> bool:
    """Whether ``torch.jit.trace``, the ONNX exporter or ``torch.compile`` records."""
    return records_forward_only() or is_compiling()


# --- Mixed precision
#: Dtypes that autocast casts between; float64 is left alone, as autocast does.
AUTOCAST_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Casts float16/bfloat16 tensors to float32; others pass through."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def cast_floating(value, dtype: torch.dtype):
    """``value.to(dtype)`` for float16/bfloat16/float32 tensors, else ``value``."""
    if isinstance(value, torch.Tensor) and value.dtype in AUTOCAST_CASTABLE:
        return value.to(dtype)
    return value


def _device_type(args) -> str:
    """The device type of the first tensor in ``args``; 'cpu' if none is."""
    return next((arg.device.type for arg in args if isinstance(arg, torch.Tensor)), 'cpu')


def apply_without_autocast(function: type, *args, cast_to: Optional[str] = 'float32'):
    """``function.apply(*args)`` with autocast off, floating inputs cast first.

    Args:
        cast_to: ``'float32'``, ``'autocast'`` (autocast's dtype) or None (no cast).
    """
    device_type = _device_type(args)
    low = autocast_dtype(device_type)
    if low is None:
        return function.apply(*args)
    if cast_to is not None:
        dtype = torch.float32 if cast_to == 'float32' else low
        args = [cast_floating(arg, dtype) for arg in args]
    with autocast_off(device_type):
        return function.apply(*args)


def backward_without_autocast(backward: Callable) -> Callable:
    """Decorator: runs an autograd ``backward`` with autocast off."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with autocast_off(_device_type(grads)):
            return backward(ctx, *grads)

    return wrapper



# --- Gradient layout
class ContiguousGradient(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous in the given
    memory format."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor,
                memory_format: torch.memory_format) -> torch.Tensor:
        ctx.memory_format = memory_format
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.contiguous(memory_format=ctx.memory_format), None


def memory_format_of(tensor: torch.Tensor) -> torch.memory_format:
    """``torch.channels_last`` for a channels-last 4-d tensor, else
    ``torch.contiguous_format``."""
    if (tensor.dim() == 4 and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=torch.channels_last)):
        return torch.channels_last
    return torch.contiguous_format


def contiguous_gradient(tensor: torch.Tensor,
                        memory_format: torch.memory_format = torch.contiguous_format
                        ) -> torch.Tensor:
    """``tensor`` as a view whose gradient is made contiguous (in
    ``memory_format``) in backward."""
    if tensor.requires_grad and not records_forward_only():
        return ContiguousGradient.apply(tensor, memory_format)
    return tensor



# --- Valid regions
ValidShapes = List[Tuple[int, int]]


def check_valid_shapes(valid_shapes: Sequence,
                       batch_shape: Sequence[int]) -> ValidShapes:
    """Checks one ``(h, w)`` per image against a padded batch (B, C, H, W).

    Raises:
        ValueError: Wrong count, or a region outside (H, W).
    """
    batch, height, width = batch_shape[0], batch_shape[-2], batch_shape[-1]
    shapes = [tuple(int(side) for side in shape) for shape in valid_shapes]
    if len(shapes) != batch:
        raise ValueError(f'valid_shapes={shapes} has {len(shapes)} entries; expected '
                         f'one (h, w) per image of the batch of {batch}.')
    for shape in shapes:
        if len(shape) != 2 or not (0 < shape[0] <= height and 0 < shape[1] <= width):
            raise ValueError(f'valid_shapes={shapes} is invalid; expected (h, w) '
                             f'with 0 < h <= {height} and 0 < w <= {width}, the '
                             f'padded batch size.')
    return shapes


def strided_shapes(valid_shapes: ValidShapes, strides: Sequence[int]) -> ValidShapes:
    """Regions after convolutions of ``strides``: L -> ceil(L / s) each."""
    shapes = valid_shapes
    for stride in strides:
        shapes = [(-(-h // stride), -(-w // stride)) for h, w in shapes]
    return shapes



def per_distinct_shape(make: Callable[[Tuple[int, int]], torch.Tensor],
                       valid_shapes: ValidShapes
                       ) -> Dict[Tuple[int, int], torch.Tensor]:
    """``{shape: make(shape)}`` for each distinct shape, in first-seen order."""
    made = {}
    for shape in valid_shapes:
        if shape not in made:
            made[shape] = make(shape)
    return made


def valid_mask(valid_shapes: ValidShapes, hw_shape: Sequence[int],
               device=None) -> torch.Tensor:
    """(B, H, W) bool mask, True inside each image's region of the grid."""
    rows = torch.arange(hw_shape[0], device=device)  # (H, )
    cols = torch.arange(hw_shape[1], device=device)  # (W, )
    return torch.stack([(rows < height)[:, None] & (cols < width)[None, :]
                        for height, width in valid_shapes])  # (B, H, W)


def mask_map(feature_map: torch.Tensor, valid_shapes: Optional[ValidShapes],
             fill: float = 0.) -> torch.Tensor:
    """Fills a (B, C, H, W) map with ``fill`` outside the regions (None: as is)."""
    if valid_shapes is None:
        return feature_map
    inside = valid_mask(valid_shapes, feature_map.shape[-2:], feature_map.device)
    return feature_map.masked_fill(~inside[:, None], fill)


def pad_to_grid(feature_map: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Zero-pads (..., h, w) at the bottom and right to (..., H, W)."""
    height, width = feature_map.shape[-2:]
    return F.pad(feature_map, (0, hw_shape[1] - width, 0, hw_shape[0] - height))



# --- Recomputation
_STATE = threading.local()


def is_recomputing() -> bool:
    """Whether backward is rerunning a function checkpointed by ``recomputed``."""
    return getattr(_STATE, 'recomputing', False)


@contextmanager
def _recomputing(rerun: bool) -> Iterator[None]:
    outer = is_recomputing()
    _STATE.recomputing = outer or rerun
    try:
        yield
    finally:
        _STATE.recomputing = outer


class FirstPassFlag:
    """Callable: True at its first call, False afterwards."""

    def __init__(self):
        self.called = False

    def __call__(self) -> bool:
        first = not self.called
        self.called = True
        return first


def recomputed(function: Callable, *args):
    """``function(*args)``, checkpointed; it must not update state when rerun."""
    first_pass = FirstPassFlag()

    def run(*inputs):
        with _recomputing(not first_pass()):
            return function(*inputs)

    return checkpoint(run, *args, use_reentrant=False)



def run_block(block: nn.Module, x: torch.Tensor, *args,
              checkpointing: bool = False) -> torch.Tensor:
    """``block(x, *args)``; with ``checkpointing`` and a gradient to compute,
    recomputed in backward instead of keeping its tensors (``recomputed``)."""
    if checkpointing and x.requires_grad:
        return recomputed(block, x, *args)
    return block(x, *args)


def recomputes_locally(norm: nn.Module) -> bool:
    """Whether ``norm`` is a plain BatchNorm2d (not SyncBatchNorm)."""
    return type(norm) is nn.BatchNorm2d



# --- Attention heads
def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, h * d) -> (B, h, N, d)."""
    batch, tokens, channels = x.shape
    return x.reshape(batch, tokens, num_heads, channels // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    batch, heads, tokens, dims = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * dims)



# --- GELU
def gelu(tensor: torch.Tensor) -> torch.Tensor:
    """Exact ``F.gelu``; where torch needs it, its backward gets a gradient
    laid out as its input (contiguous, or channels-last)."""
    out = F.gelu(tensor)
    if GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT:
        out = contiguous_gradient(out, memory_format_of(tensor))
    return out


# --- MLP, memory-saving
def scaled_weight_and_bias(layer: nn.Module, scale: Optional[torch.Tensor]
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Weight and bias computing ``scale * layer(x)``: W' = s W, b' = s b.

    Returns:
        Weight (C_out, ...) and bias (C_out,); the layer's own if ``scale`` is None.
    """
    weight, bias = layer.weight, layer.bias
    if scale is None:
        return weight, bias
    weight = weight * scale.view(-1, *(1, ) * (weight.dim() - 1))  # (C_out, ...)
    return weight, None if bias is None else bias * scale



def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """(..., C) -> (N, C)."""
    return tensor.reshape(-1, tensor.shape[-1])


def _bias_grad(grad: torch.Tensor, bias: Optional[torch.Tensor]):
    return None if bias is None else _flat(grad).sum(0)


def _mlp_backward(act: nn.Module, x: torch.Tensor, pre: Optional[torch.Tensor],
                  weight1: torch.Tensor, bias1: Optional[torch.Tensor],
                  weight2: torch.Tensor, grad_out: torch.Tensor, bias2_grad: bool):
    """Gradients of ``fc2(act(fc1(x)))`` from its input x (..., C) and
    ``pre = fc1(x)`` (..., hidden), which is recomputed if None.

    Returns:
        Gradients of x, weight1, bias1, weight2 and bias2 (None where not needed).
    """
    if pre is None:
        pre = F.linear(x, weight1, bias1)
    with torch.enable_grad():
        pre = pre.detach().requires_grad_()
        hidden = act(pre)  # g, (..., hidden)
    grad_hidden = grad_out @ weight2  # (..., hidden)
    grad_weight2 = _flat(grad_out).transpose(0, 1) @ _flat(hidden.detach())
    grad_pre, = torch.autograd.grad(hidden, pre, grad_hidden)
    grad_weight1 = _flat(grad_pre).transpose(0, 1) @ _flat(x)
    grad_x = grad_pre @ weight1
    grad_bias2 = _flat(grad_out).sum(0) if bias2_grad else None
    return grad_x, grad_weight1, _bias_grad(grad_pre, bias1), grad_weight2, grad_bias2


class RecomputedMLP(torch.autograd.Function):
    """Autograd function of ``recomputed_mlp``."""

    @staticmethod
    def forward(ctx, x, weight1, bias1, weight2, bias2, act, keep_hidden):
        pre = F.linear(x, weight1, bias1)  # h, (..., 4C)
        ctx.save_for_backward(x, pre if keep_hidden else None, weight1, bias1,
                              weight2)
        ctx.act = act
        return F.linear(act(pre), weight2, bias2)  # (..., C)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        """``h = fc1(x)`` (kept or recomputed), ``g = act(h)`` recomputed, G:
        ``dW2 = G^T g``, ``dh = act'(h) o (G W2)``, ``dW1 = dh^T x``, ``dx = dh W1``."""
        x, pre, weight1, bias1, weight2 = ctx.saved_tensors
        grads = _mlp_backward(ctx.act, x, pre, weight1, bias1, weight2, grad_out,
                              ctx.needs_input_grad[4])
        return (*grads, None, None)


def recomputed_mlp(x: torch.Tensor, weight1: torch.Tensor,
                   bias1: Optional[torch.Tensor], act: nn.Module,
                   weight2: torch.Tensor, bias2: Optional[torch.Tensor],
                   keep_hidden: bool = True) -> torch.Tensor:
    """``fc2(act(fc1(x)))`` without keeping ``act``'s output for backward.

    Args:
        x: Tokens (..., C).
        weight1, bias1: fc1's weight (hidden, C) and bias (hidden,) or None.
        weight2, bias2: fc2's weight (C, hidden) and bias (C,) or None.
        keep_hidden: Keep ``fc1(x)`` for backward; False recomputes it.

    Returns:
        Tensor (..., C), in autocast's dtype under autocast.
    """
    return apply_without_autocast(RecomputedMLP, x, weight1, bias1, weight2,
                                  bias2, act, keep_hidden, cast_to='autocast')


def layer_norm_input_grad(grad: torch.Tensor, normalized: torch.Tensor,
                          rstd: torch.Tensor) -> torch.Tensor:
    """dx of ``x^ = (x - mean) / sigma`` over the last dimension, from dx^ (..., C),
    x^ (..., C) and 1/sigma (..., 1): ``(g - mean(g) - x^ mean(g x^)) / sigma``."""
    return rstd * (grad - grad.mean(-1, keepdim=True)
                   - normalized * (grad * normalized).mean(-1, keepdim=True))



class LayerNormMLP(torch.autograd.Function):
    """Autograd function of ``layer_norm_mlp``."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight1, bias1, weight2, bias2,
                act, keep_hidden):
        channels = x.shape[-1]
        normalized, _, rstd = torch.native_layer_norm(  # x^, (..., C); (..., 1)
            x, (channels, ), None, None, eps)
        y = torch.addcmul(norm_bias, normalized, norm_weight)  # (..., C)
        mlp_in = y.to(weight1.dtype)
        pre = F.linear(mlp_in, weight1, bias1)  # (..., hidden)
        ctx.save_for_backward(normalized, rstd, pre if keep_hidden else None,
                              norm_weight, norm_bias, weight1, bias1, weight2)
        ctx.act = act
        ctx.set_materialize_grads(False)  # y's gradient is None where y is unused
        return y, F.linear(act(pre), weight2, bias2)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_y, grad_out):
        """``y = gamma x^ + beta`` recomputed; the MLP's gradients as
        ``RecomputedMLP``'s add to ``dy``; ``d gamma = sum dy o x^``,
        ``d beta = sum dy``, ``dx = layer_norm_input_grad(gamma dy)``."""
        normalized, rstd, pre, norm_weight, norm_bias, weight1, bias1, weight2 = \
            ctx.saved_tensors
        grads = (None, ) * 5  # of y and the MLP's parameters, where mlp(y) is used
        if grad_out is not None:
            y = torch.addcmul(norm_bias, normalized, norm_weight)  # recomputed
            grads = _mlp_backward(ctx.act, y.to(weight1.dtype), pre, weight1, bias1,
                                  weight2, grad_out.to(weight2.dtype),
                                  ctx.needs_input_grad[7])
            grad_y = grads[0].to(y.dtype) if grad_y is None else grad_y + grads[0]
        if grad_y is None:  # neither output used
            return (None, ) * 10
        grad_norm_weight = _flat(grad_y * normalized).sum(0)  # (C,)
        grad_norm_bias = _flat(grad_y).sum(0)  # (C,)
        grad_x = layer_norm_input_grad(grad_y * norm_weight, normalized, rstd)
        return (grad_x, grad_norm_weight, grad_norm_bias, None, *grads[1:], None, None)


def layer_norm_mlp(x: torch.Tensor, norm: nn.LayerNorm, mlp: nn.Module,
                   weight2: torch.Tensor, bias2: Optional[torch.Tensor]
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``y = norm(x)`` and ``mlp(y)``, keeping for backward only the normalised
    x^ = (x - mean) / sigma and 1/sigma instead of x and y:
    ``y = gamma x^ + beta`` is recomputed in backward, and
    ``dx = (g - mean(g) - x^ mean(g x^)) / sigma`` with ``g = gamma dy``.

    Args:
        x: Tokens (..., C), the LayerNorm's input.
        norm: The LayerNorm (affine, over the last dimension).
        mlp: The MLP; its activation output is recomputed as in ``recomputed_mlp``.
        weight2, bias2: fc2's weight and bias as run (LayerScale folded in).

    Returns:
        ``y`` (..., C) in float32 under autocast, as LayerNorm's, and ``mlp(y)``
        (..., C) in autocast's dtype under autocast.
    """
    low = autocast_dtype(x.device.type)
    mlp_args = (mlp.fc1.weight, mlp.fc1.bias, weight2, bias2)
    norm_args = (x, norm.weight, norm.bias)
    if low is not None:
        mlp_args = [cast_floating(arg, low) for arg in mlp_args]
        norm_args = [cast_floating(arg, torch.float32) for arg in norm_args]
    with autocast_off(x.device.type):
        x, norm_weight, norm_bias = norm_args
        return LayerNormMLP.apply(x, norm_weight, norm_bias, norm.eps, *mlp_args,
                                  mlp.act, mlp.keep_hidden)



# --- Fused BatchNorm, activation and convolution
CONVOLUTIONS = (nn.Conv2d, nn.ConvTranspose2d)


def batch_norm_like_forward(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the statistics its forward uses, updating none."""
    batch_stats = norm.training or not norm.track_running_stats
    return F.batch_norm(x, None if batch_stats else norm.running_mean,
                        None if batch_stats else norm.running_var, norm.weight,
                        norm.bias, training=batch_stats, eps=norm.eps)


def _activated(norm: Callable[[torch.Tensor], torch.Tensor], act: nn.Module,
               x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``act(norm(x))``, zero where ``mask`` (B, 1, H, W) is False."""
    hidden = act(norm(x))
    return hidden if mask is None else hidden.masked_fill(~mask, 0.)


def norm_input(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` cast to BatchNorm's compute dtype (that of its parameters)."""
    if norm.weight is None:
        return full_precision(x)
    return x.to(norm.weight.dtype)


def convolution(conv: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``conv(x)`` (Conv2d or ConvTranspose2d) with the given weight and bias."""
    return torch.convolution(x, weight, bias, conv.stride, conv.padding, conv.dilation,
                             conv.transposed, conv.output_padding, conv.groups)


class NormActConv(torch.autograd.Function):
    """Autograd function of ``norm_act_conv``."""

    @staticmethod
    def forward(ctx, x, mask, norm_weight, norm_bias, conv_weight, conv_bias, layers,
                out_dtype, first_weight=None, first_bias=None):
        first, norm, act, conv = layers
        inputs = x
        if first is not None:  # x = first(inputs), recomputed in backward
            x = convolution(first, inputs, first_weight, first_bias)
        # Updates the running statistics once.
        hidden = _activated(norm, act, norm_input(norm, x), mask).to(out_dtype)
        ctx.save_for_backward(inputs, mask, conv_weight, first_weight, first_bias)
        ctx.layers = layers
        ctx.out_dtype = out_dtype
        if conv is None:
            return hidden
        return convolution(conv, hidden, conv_weight, conv_bias)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        """With ``h = m * act(BN(x))``, ``y = conv(h)`` and ``G = dL/dy``:
        ``dh = conv^T(G)``, ``dW = G * h`` (correlation), ``db = sum G``; ``dx``,
        ``d gamma`` and ``d beta`` by autograd through ``h``, recomputed from x
        with the statistics forward used; with ``x = first(u)``:
        ``du = first^T(dx)``, ``dW_first = dx * u``."""
        inputs, mask, conv_weight, first_weight, first_bias = ctx.saved_tensors
        first, norm, act, conv = ctx.layers
        x = inputs if first is None else convolution(first, inputs, first_weight,
                                                     first_bias)
        input_dtype = x.dtype
        with torch.enable_grad():
            x = norm_input(norm, x.detach()).requires_grad_()
            hidden = _activated(partial(batch_norm_like_forward, norm), act, x,
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
        grad_x, grad_first = grads[0].to(input_dtype), (None, None)
        if first is not None:
            grad_x, *grad_first = convolution_backward(
                first, grad_x, inputs, first_weight, ctx.needs_input_grad[8:10],
                needs_input=ctx.needs_input_grad[0])
        return (grad_x, None, grad_norm_weight, grad_norm_bias, grad_conv_weight,
                grad_conv_bias, None, None, *grad_first)


def convolution_backward(conv: nn.Module, grad_out: torch.Tensor,
                         inputs: torch.Tensor, weight: torch.Tensor,
                         needs_grad: Sequence[bool], needs_input: bool = True):
    """Gradients of ``conv``'s input (if ``needs_input``), weight and bias
    (as ``needs_grad``), without running it."""
    bias_sizes = None if conv.bias is None else [conv.bias.shape[0]]
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad_out, inputs, weight, bias_sizes, conv.stride, conv.padding,
        conv.dilation, conv.transposed, conv.output_padding, conv.groups,
        [needs_input, needs_grad[0], needs_grad[1] and conv.bias is not None])
    return grad_input, grad_weight, grad_bias


def norm_act_conv(x: torch.Tensor, norm: nn.BatchNorm2d, act: nn.Module,
                  conv: Optional[nn.Module] = None,
                  mask: Optional[torch.Tensor] = None,
                  first: Optional[nn.Conv2d] = None) -> torch.Tensor:
    """``conv(act(norm(x)) * mask)`` keeping only ``x`` for backward; with
    ``first``, ``conv(act(norm(first(x))) * mask)`` keeping only ``x``
    (``first(x)`` is recomputed in backward).

    Args:
        x: BatchNorm input (B, C, H, W), or ``first``'s input.
        conv: Zero-padded Conv2d or ConvTranspose2d; None ends at ``act``.
        mask: (B, 1, H, W) bool, False where zeroed before ``conv``. Default: None.
        first: A convolution before ``norm``. Default: None.

    Returns:
        The output, in autocast's dtype under autocast, else in ``x``'s.
    """
    low = autocast_dtype(x.device.type)
    out_dtype = low if low is not None and x.dtype in AUTOCAST_CASTABLE else x.dtype
    conv_weight = None if conv is None else cast_floating(conv.weight, out_dtype)
    conv_bias = None if conv is None else cast_floating(conv.bias, out_dtype)
    first_args = ()
    if first is not None:  # cast as autocast casts a convolution's operands
        x = cast_floating(x, out_dtype)
        first_args = (cast_floating(first.weight, out_dtype),
                      cast_floating(first.bias, out_dtype))
    return apply_without_autocast(NormActConv, x, mask, norm.weight, norm.bias,
                                  conv_weight, conv_bias, (first, norm, act, conv),
                                  out_dtype, *first_args, cast_to=None)


def recomputes_first_conv(layers: Sequence[nn.Module]) -> bool:
    """Whether ``fused_conv_stack`` recomputes ``layers[0]`` in backward: a
    convolution reading an image (at most 4 channels), which costs little to
    rerun, followed by a fusable BatchNorm and activation."""
    first = layers[0]
    return (isinstance(first, nn.Conv2d) and first.in_channels <= 4
            and fusable(layers, 1) and _zero_padded(_following_conv(layers, 1)))


def fusable(layers: Sequence[nn.Module], index: int) -> bool:
    """Whether ``layers[index:]`` starts with BatchNorm2d + parameter-free act."""
    return (index + 1 < len(layers) and recomputes_locally(layers[index])
            and not isinstance(layers[index + 1], (nn.BatchNorm2d, *CONVOLUTIONS))
            and not any(True for _ in layers[index + 1].parameters()))


def _zero_padded(conv: Optional[nn.Module]) -> bool:
    return conv is None or getattr(conv, 'padding_mode', 'zeros') == 'zeros'


def conv_output_shape(conv: nn.Conv2d, x: torch.Tensor) -> Tuple[int, int]:
    """(H', W') of ``conv(x)`` for x (B, C, H, W)."""
    return tuple((size + 2 * pad - dil * (kernel - 1) - 1) // stride + 1
                 for size, pad, dil, kernel, stride in zip(
                     x.shape[-2:], conv.padding, conv.dilation, conv.kernel_size,
                     conv.stride))


def _following_conv(layers: Sequence[nn.Module], index: int) -> Optional[nn.Module]:
    """The convolution after ``layers[index]`` and its activation, if any."""
    following = layers[index + 2] if index + 2 < len(layers) else None
    return following if isinstance(following, CONVOLUTIONS) else None


def fused_conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
                     valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """``conv_stack`` with each ``BN -> act (-> conv)`` fused by ``norm_act_conv``,
    the first convolution too where it reads an image (``recomputes_first_conv``)."""
    layers: List[nn.Module] = list(layers)
    index, first = 0, None
    if recomputes_first_conv(layers):
        first, x = layers[0], mask_map(x, valid_shapes)
        if valid_shapes is not None:
            valid_shapes = strided_shapes(valid_shapes, first.stride[:1])
        index = 1
    while index < len(layers):
        layer = layers[index]
        following = _following_conv(layers, index)
        if fusable(layers, index) and _zero_padded(following):
            mask = None
            if following is not None and valid_shapes is not None:
                shape = x.shape[-2:] if first is None else conv_output_shape(first, x)
                mask = valid_mask(valid_shapes, shape, x.device)[:, None]
            x = norm_act_conv(x, layer, layers[index + 1], following, mask, first)
            first = None
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



def conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
               valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """Runs ``layers`` in turn; Conv2d inputs are zeroed outside ``valid_shapes``."""
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, valid_shapes))  # (B, C', ceil(H / s), ceil(W / s))
            if valid_shapes is not None:
                valid_shapes = strided_shapes(valid_shapes, layer.stride[:1])
        else:  # BatchNorm, activation
            x = layer(x)
    return mask_map(x, valid_shapes)
