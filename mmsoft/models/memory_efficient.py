"""The memory-saving path: a twin of each block, and the autograd functions it runs.

A block whose ``memory_efficient`` flag is on hands itself to its twin here
when a gradient is recorded; the twin keeps less for backward and recomputes
the rest: a LayerNorm keeps only x^ (its MLP not its activation), the stem
only its BatchNorms' inputs, SOFT's kernel products no N x m kernel and its
Newton iteration only P; UFO-ViT's attention and local patch interaction are
recomputed. What each saves: docs/cost.md.
"""
from functools import partial
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import soft, ufo_vit
from .common import (ConvPatchEmbed, Regions, ValidShapes, apply_without_autocast,
                     autocast_dtype, autocast_off, backward_without_autocast,
                     batch_norm_once, cast_floating, full_precision, mask_map,
                     merge_heads, recomputed, recomputes_locally, strided_shapes,
                     valid_mask)


def scaled_weight_and_bias(layer: nn.Module, scale: Optional[torch.Tensor]):
    """The weight and bias of ``scale * layer(x)``: ``s W`` and ``s b``."""
    weight, bias = layer.weight, layer.bias
    if scale is None:
        return weight, bias
    weight = weight * scale.view(-1, *(1, ) * (weight.dim() - 1))  # (C_out, ...)
    return weight, None if bias is None else bias * scale


# --- MLP
def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1])


def _mlp_backward(act: nn.Module, x, pre, weight1, bias1, weight2, grad_out,
                  bias2_grad: bool):
    """Gradients of ``fc2(act(fc1(x)))``: of x, fc1's weight and bias, fc2's
    weight and bias. ``pre = fc1(x)`` is recomputed when None."""
    if pre is None:
        pre = F.linear(x, weight1, bias1)
    with torch.enable_grad():
        pre = pre.detach().requires_grad_()
        hidden = act(pre)  # (..., hidden)

    grad_hidden = grad_out @ weight2
    grad_weight2 = _flat(grad_out).transpose(0, 1) @ _flat(hidden.detach())
    grad_pre, = torch.autograd.grad(hidden, pre, grad_hidden)
    grad_weight1 = _flat(grad_pre).transpose(0, 1) @ _flat(x)
    grad_bias1 = None if bias1 is None else _flat(grad_pre).sum(0)
    grad_bias2 = _flat(grad_out).sum(0) if bias2_grad else None
    return grad_pre @ weight1, grad_weight1, grad_bias1, grad_weight2, grad_bias2


def layer_norm_backward(grad: torch.Tensor, normalized: torch.Tensor, rstd: torch.Tensor,
                        weight: Optional[torch.Tensor] = None,
                        bias: Optional[torch.Tensor] = None):
    """The gradients of x, gamma and beta of ``gamma x^ + beta``,
    ``x^ = (x - mean) / sigma``, from dy, x^ and 1/sigma (..., 1), without x:
    ``dx = (g - mean(g) - x^ mean(g x^)) / sigma`` with ``g = gamma dy``.

    torch's LayerNorm backward on x^ as its input (mean 0, 1/sigma 1), dx
    scaled by 1/sigma.
    """
    grad_x, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
        grad, normalized, normalized.shape[-1:], torch.zeros_like(rstd),
        torch.ones_like(rstd), weight, bias,
        [True, weight is not None, bias is not None])
    return grad_x * rstd, grad_weight, grad_bias


class LayerNormMLP(torch.autograd.Function):
    """``y = norm(x)`` and ``mlp(y)``, keeping x^ = (x - mean) / sigma and 1/sigma.

    Backward, with ``h = fc1(y)`` (kept, or recomputed unless ``keep_hidden``)
    and ``g = act(h)`` recomputed: ``dW2 = G^T g``, ``dh = act'(h) o (G W2)``,
    ``dW1 = dh^T y``, ``dy = dh W1``; then :func:`layer_norm_backward` with
    ``y = gamma x^ + beta`` recomputed.
    """

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight1, bias1, weight2, bias2,
                act, keep_hidden):
        normalized, _, rstd = torch.native_layer_norm(x, (x.shape[-1], ), None, None,
                                                      eps)  # x^ (..., C), (..., 1)
        y = torch.addcmul(norm_bias, normalized, norm_weight)
        pre = F.linear(y.to(weight1.dtype), weight1, bias1)  # (..., hidden)
        ctx.save_for_backward(normalized, rstd, pre if keep_hidden else None,
                              norm_weight, norm_bias, weight1, bias1, weight2)
        ctx.act = act
        ctx.set_materialize_grads(False)  # y's gradient is None where y is unused
        return y, F.linear(act(pre), weight2, bias2)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_y, grad_out):
        normalized, rstd, pre, norm_weight, norm_bias, weight1, bias1, weight2 = \
            ctx.saved_tensors
        grads = (None, ) * 5
        if grad_out is not None:
            y = torch.addcmul(norm_bias, normalized, norm_weight)
            grads = _mlp_backward(ctx.act, y.to(weight1.dtype), pre, weight1, bias1,
                                  weight2, grad_out.to(weight2.dtype),
                                  ctx.needs_input_grad[7])
            grad_y = grads[0].to(y.dtype) if grad_y is None else grad_y + grads[0]
        if grad_y is None:
            return (None, ) * 10

        grad_x, grad_norm_weight, grad_norm_bias = layer_norm_backward(
            grad_y, normalized, rstd, norm_weight, norm_bias)
        return (grad_x, grad_norm_weight, grad_norm_bias, None, *grads[1:], None, None)


def layer_norm_mlp(x: torch.Tensor, norm: nn.LayerNorm, mlp: nn.Module,
                   layer_scale: Optional[torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``y = norm(x)`` and ``layer_scale * mlp(y)``, keeping only x^ and 1/sigma.

    With dropout active, plain autograd runs. Returns ``y`` in float32 under
    autocast (as LayerNorm) and ``mlp(y)`` in autocast's dtype.
    """
    if mlp.training and mlp.drop.p > 0:
        y = norm(x)
        out = mlp(y)
        return y, out if layer_scale is None else layer_scale * out

    weight2, bias2 = scaled_weight_and_bias(mlp.fc2, layer_scale)
    mlp_args = (mlp.fc1.weight, mlp.fc1.bias, weight2, bias2)
    norm_args = (x, norm.weight, norm.bias)
    low = autocast_dtype(x.device.type)
    if low is not None:
        mlp_args = [cast_floating(arg, low) for arg in mlp_args]
        norm_args = [cast_floating(arg, torch.float32) for arg in norm_args]
    with autocast_off(x.device.type):
        return LayerNormMLP.apply(*norm_args[:1], *norm_args[1:], norm.eps, *mlp_args,
                                  mlp.act, mlp.keep_hidden)


# --- LayerNorm before a Linear
class Normalize(torch.autograd.Function):
    """``x^ = (x - mean) / sigma``, keeping x^ and 1/sigma; backward
    :func:`layer_norm_backward`."""

    @staticmethod
    def forward(ctx, x, eps):
        normalized, _, rstd = torch.native_layer_norm(x, (x.shape[-1], ), None, None,
                                                      eps)
        ctx.save_for_backward(normalized, rstd)
        return normalized

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad):
        normalized, rstd = ctx.saved_tensors
        return layer_norm_backward(grad, normalized, rstd)[0], None


def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without affine over the last dimension, keeping its output x^
    for backward instead of x; float32 under autocast."""
    return apply_without_autocast(Normalize, x, eps)


def fold_layer_norm(layer: nn.Linear, norm: nn.LayerNorm):
    """The weight ``W diag(gamma)`` and bias ``b + W beta`` computing
    ``layer(norm(x))`` from x^."""
    with autocast_off(layer.weight.device.type):
        shift = (layer.weight * norm.bias).sum(-1)  # W beta, in full precision
        weight = layer.weight * norm.weight
    return weight, shift if layer.bias is None else layer.bias + shift


# --- The stem: BatchNorm, activation and convolution
CONVOLUTIONS = (nn.Conv2d, nn.ConvTranspose2d)


def batch_norm_like_forward(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the statistics its forward uses, updating none."""
    batch_stats = norm.training or not norm.track_running_stats
    return F.batch_norm(x, None if batch_stats else norm.running_mean,
                        None if batch_stats else norm.running_var, norm.weight,
                        norm.bias, training=batch_stats, eps=norm.eps)


def _activated(norm: Callable, act: nn.Module, x: torch.Tensor,
               mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``act(norm(x))``, zero where ``mask`` (B, 1, H, W) is False."""
    hidden = act(norm(x))
    return hidden if mask is None else hidden.masked_fill(~mask, 0.)


def norm_input(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` in BatchNorm's compute dtype, that of its parameters."""
    if norm.weight is None:
        return full_precision(x)
    return x.to(norm.weight.dtype)


def convolution(conv: nn.Module, x: torch.Tensor, weight, bias) -> torch.Tensor:
    """``conv(x)`` (Conv2d or ConvTranspose2d) with the given weight and bias."""
    return torch.convolution(x, weight, bias, conv.stride, conv.padding, conv.dilation,
                             conv.transposed, conv.output_padding, conv.groups)


def convolution_backward(conv: nn.Module, grad_out, inputs, weight,
                         needs_grad: Sequence[bool], needs_input: bool = True):
    """The gradients of ``conv``'s input, weight and bias, without running it."""
    bias_sizes = None if conv.bias is None else [conv.bias.shape[0]]
    return torch.ops.aten.convolution_backward(
        grad_out, inputs, weight, bias_sizes, conv.stride, conv.padding, conv.dilation,
        conv.transposed, conv.output_padding, conv.groups,
        [needs_input, needs_grad[0], needs_grad[1] and conv.bias is not None])


class NormActConv(torch.autograd.Function):
    """``conv(act(norm(x)) * mask)``, keeping only x; with ``first``,
    ``conv(act(norm(first(x))) * mask)``, ``first(x)`` recomputed.

    Backward, with ``h = m * act(BN(x))``, ``y = conv(h)`` and G: ``dh =
    conv^T(G)``, ``dW = G * h``, ``db = sum G``; ``dx``, ``d gamma`` and
    ``d beta`` by autograd through ``h`` recomputed with the statistics
    forward used; with ``x = first(u)``: ``du = first^T(dx)``, ``dW_first = dx * u``.
    """

    @staticmethod
    def forward(ctx, x, mask, norm_weight, norm_bias, conv_weight, conv_bias, layers,
                out_dtype, first_weight=None, first_bias=None):
        first, norm, act, conv = layers
        inputs = x
        if first is not None:
            x = convolution(first, inputs, first_weight, first_bias)
        # The running statistics update once, here.
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
        grad_hidden = grad_out
        if conv is not None:
            grad_hidden, grad_conv_weight, grad_conv_bias = convolution_backward(
                conv, grad_out, hidden.detach(), conv_weight, ctx.needs_input_grad[4:6])
        params = [p for p in (norm.weight, norm.bias) if p is not None]
        grads = torch.autograd.grad(hidden, [x] + params, grad_hidden)
        grad_norm_weight, grad_norm_bias = grads[1:] if params else (None, None)

        grad_x, grad_first = grads[0].to(input_dtype), (None, None)
        if first is not None:
            grad_x, *grad_first = convolution_backward(
                first, grad_x, inputs, first_weight, ctx.needs_input_grad[8:10],
                needs_input=ctx.needs_input_grad[0])
        return (grad_x, None, grad_norm_weight, grad_norm_bias, grad_conv_weight,
                grad_conv_bias, None, None, *grad_first)


def norm_act_conv(x: torch.Tensor, norm: nn.BatchNorm2d, act: nn.Module,
                  conv: Optional[nn.Module] = None, mask: Optional[torch.Tensor] = None,
                  first: Optional[nn.Conv2d] = None) -> torch.Tensor:
    """:class:`NormActConv` of the layers; in autocast's dtype under autocast."""
    low = autocast_dtype(x.device.type)
    float_input = x.dtype in (torch.float16, torch.bfloat16, torch.float32)
    out_dtype = low if low is not None and float_input else x.dtype

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


def fusable(layers: Sequence[nn.Module], index: int) -> bool:
    """Whether ``layers[index:]`` starts with a BatchNorm2d and a parameter-free
    act, then a zero-padded convolution or none."""
    following = _following_conv(layers, index)
    return (index + 1 < len(layers) and recomputes_locally(layers[index])
            and not isinstance(layers[index + 1], (nn.BatchNorm2d, *CONVOLUTIONS))
            and not any(True for _ in layers[index + 1].parameters())
            and getattr(following, 'padding_mode', 'zeros') == 'zeros')


def _following_conv(layers: Sequence[nn.Module], index: int) -> Optional[nn.Module]:
    """The convolution after ``layers[index]`` and its activation, if any."""
    following = layers[index + 2] if index + 2 < len(layers) else None
    return following if isinstance(following, CONVOLUTIONS) else None


def recomputes_first_conv(layers: Sequence[nn.Module]) -> bool:
    """Whether :func:`fused_conv_stack` recomputes ``layers[0]``: a convolution
    reading an image (at most 4 channels), then a fusable BatchNorm and act."""
    first = layers[0]
    return (isinstance(first, nn.Conv2d) and first.in_channels <= 4
            and fusable(layers, 1))


def conv_output_shape(conv: nn.Conv2d, x: torch.Tensor) -> Tuple[int, int]:
    """(H', W') of ``conv(x)`` for x (B, C, H, W)."""
    return tuple((size + 2 * pad - dil * (kernel - 1) - 1) // stride + 1
                 for size, pad, dil, kernel, stride in zip(
                     x.shape[-2:], conv.padding, conv.dilation, conv.kernel_size,
                     conv.stride))


def fused_conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
                     valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """:func:`~.common.conv_stack` with each ``BN -> act (-> conv)`` fused by
    :func:`norm_act_conv`, and the first convolution where it reads an image."""
    layers = list(layers)
    index, first = 0, None
    if recomputes_first_conv(layers):
        first, x = layers[0], mask_map(x, valid_shapes)
        if valid_shapes is not None:
            valid_shapes = strided_shapes(valid_shapes, first.stride[:1])
        index = 1

    while index < len(layers):
        layer = layers[index]
        following = _following_conv(layers, index)
        if fusable(layers, index):
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


# --- SOFT: the kernel products and the Newton iteration
def _chunks(tokens: int, chunk: int) -> List[Tuple[int, int]]:
    return [(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk)]


def kernel_summary(left, right, values, chunk: int) -> torch.Tensor:
    """``K1^T V`` chunk by chunk, ``K1 = exp(left . right^T)``: (B, h, m, d)."""
    summary = None
    for start, end in _chunks(left.shape[-2], chunk):
        kernel = soft.kernel_of_operands(left[..., start:end, :], right)  # (B,h,c,m)
        part = kernel.transpose(-1, -2) @ values[..., start:end, :]
        summary = part if summary is None else summary.add_(part)
    return summary


def kernel_apply(left, right, factor, chunk: int) -> torch.Tensor:
    """``K1 . factor`` chunk by chunk: (B, h, N, d)."""
    out = left.new_empty(*left.shape[:-1], factor.shape[-1])
    for start, end in _chunks(left.shape[-2], chunk):
        kernel = soft.kernel_of_operands(left[..., start:end, :], right)  # (B,h,c,m)
        torch.matmul(kernel, factor, out=out[..., start:end, :])
    return out


class ChunkedKernelProduct(torch.autograd.Function):
    """``K1 . (middle . (K1^T V))``, ``K1 = k(Q, L)`` recomputed in chunks.

    Backward, with ``S = K1^T V``, ``R = middle S``, G, ``K1 = exp(E)``,
    ``E = A B^T``, ``A = [Q, -|Q|^2 / 2, 1]``, ``B = [L, 1, -|L|^2 / 2]``:
    ``dR = K1^T G``, ``d middle = dR S^T``, ``dS = middle^T dR``, ``dV = K1 dS``,
    ``dE = (G R^T + V dS^T) o K1``, ``dA = dE B``, ``dB = dE^T A``; ``dQ0 = s
    (dA_Q - dA_|Q| Q)``, ``dL = dB_L - dB_|L| L``."""

    @staticmethod
    def forward(ctx, queries, bottleneck, middle, values, chunk, query_scale):
        left, right = soft.kernel_operands(queries * query_scale, bottleneck)
        if queries.shape[-2] <= chunk:  # one kernel evaluation serves both products
            kernel = soft.kernel_of_operands(left, right)  # (B, h, N, m)
            summary = kernel.transpose(-1, -2) @ values  # (B, h, m, d)
            factor = middle @ summary
            out = kernel @ factor
        else:
            summary = kernel_summary(left, right, values, chunk)
            factor = middle @ summary
            out = kernel_apply(left, right, factor, chunk)

        ctx.save_for_backward(queries, bottleneck, middle, values, summary, factor)
        ctx.chunk = chunk
        ctx.query_scale = query_scale
        return out

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        queries, bottleneck, middle, values, summary, factor = ctx.saved_tensors
        scale = ctx.query_scale
        scaled = queries * scale  # Q: (B, h, N, d)
        left, right = soft.kernel_operands(scaled, bottleneck)  # (B, h, N | m, d + 2)
        tokens, dims = queries.shape[-2:]

        # The N x m temporaries in slices: a cache's size on the CPU, whole
        # chunks on a GPU; one chunk's kernel is evaluated once.
        step = ctx.chunk
        if queries.device.type == 'cpu':
            step = min(step, soft.CPU_BACKWARD_CHUNK)
        whole_kernel = (soft.kernel_of_operands(left, right) if tokens <= ctx.chunk
                        else None)  # (B, h, N, m)
        if whole_kernel is None:
            grad_factor = kernel_summary(left, right, grad_out, step)
        else:
            grad_factor = whole_kernel.transpose(-1, -2) @ grad_out  # dR
        grad_middle = grad_factor @ summary.transpose(-1, -2)  # (B, h, m, m)
        grad_summary = middle.transpose(-1, -2) @ grad_factor  # (B, h, m, d)

        grad_left = torch.empty_like(left)
        grad_values = torch.empty_like(values)
        grad_right = torch.zeros_like(right)
        # One product gives both dK1 terms: [G, V] [R, dS]^T.
        factors_t = torch.cat((factor, grad_summary), -1).transpose(-1, -2)
        for start, end in _chunks(tokens, step):
            kernel = (soft.kernel_of_operands(left[..., start:end, :], right)
                      if whole_kernel is None
                      else whole_kernel[..., start:end, :])  # (B, h, c, m)
            grad_values[..., start:end, :] = kernel @ grad_summary
            grad_and_values = torch.cat((grad_out[..., start:end, :],
                                         values[..., start:end, :]), -1)  # (B,h,c,2d)
            grad_exponent = (grad_and_values @ factors_t).mul_(kernel)  # dE
            grad_left[..., start:end, :] = grad_exponent @ right
            grad_right += grad_exponent.transpose(-1, -2) @ left[..., start:end, :]

        grad_queries = scale * (grad_left[..., :dims]
                                - grad_left[..., dims:dims + 1] * scaled)
        grad_bottleneck = (grad_right[..., :dims]
                           - grad_right[..., dims + 1:] * bottleneck)
        return grad_queries, grad_bottleneck, grad_middle, grad_values, None, None


def chunked_kernel_product(queries, bottleneck, middle, values, chunk: int,
                           query_scale: float = 1.) -> torch.Tensor:
    """:class:`ChunkedKernelProduct`: Q0 (B, h, N, d), L (B, h, m, d), middle
    (B, h, m, m) and V (B, h, N, d) -> (B, h, N, d), at most ``chunk`` rows of
    K1 at a time."""
    return apply_without_autocast(ChunkedKernelProduct, queries, bottleneck, middle,
                                  values, chunk, query_scale)


class NewtonIterations(torch.autograd.Function):
    """``V_k(P)`` of :func:`~.soft.newton_iterations`, keeping only P and alpha;
    backward recomputes the iterates (:func:`~.soft.newton_iterations_backward`)."""

    @staticmethod
    def forward(ctx, operand, alpha, num_iters):
        ctx.save_for_backward(operand, alpha)
        ctx.num_iters = num_iters
        return soft.newton_iterations(operand, alpha, num_iters)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_output):
        operand, alpha = ctx.saved_tensors
        return (soft.newton_iterations_backward(operand, alpha, ctx.num_iters,
                                                grad_output), None, None)


def recomputed_newton_iterations(operand: torch.Tensor, alpha: torch.Tensor,
                                 num_iters: int) -> torch.Tensor:
    """:func:`~.soft.newton_iterations` keeping only P for backward: (..., m, m)."""
    alpha = alpha.detach().expand(*operand.shape[:-2], 1, 1)
    return apply_without_autocast(NewtonIterations, operand, alpha, num_iters)


# --- Block twins
def soft_block(block: nn.Module, x: torch.Tensor, hw_shape,
               regions: Optional[Regions] = None) -> torch.Tensor:
    """:class:`~.soft.SoftBlock`'s function, keeping less for backward."""
    attn = block.attn
    query_map, value_map = attn.project(x, hw_shape, regions)  # (B, C, H, W) each
    bottleneck, counts = attn.bottleneck_tokens(query_map, regions)  # L: (B, h, m, d)
    queries, values = attn.heads(query_map), attn.heads(value_map)  # (B, h, N, d)
    with autocast_off(x.device.type):
        kernel_a = soft.gaussian_kernel(bottleneck, bottleneck,
                                        float32_products=True)  # A: (B, h, m, m)
        middle = soft.middle_matrix(kernel_a, attn.variant, attn.solver_to_run(),
                                    attn.newton_iters, recomputed_newton_iterations,
                                    counts)
        out = chunked_kernel_product(queries, bottleneck, middle, values,
                                     attn.chunk_tokens(queries), attn.scale)
    x = x + block.drop_path(attn.output(out, value_map))

    x, mlp_out = layer_norm_mlp(x, block.norm1, block.mlp)
    return block.norm2(x + block.drop_path(mlp_out))


def softmax_block(block: nn.Module, x: torch.Tensor, hw_shape,
                  regions: Optional[Regions] = None) -> torch.Tensor:
    """:class:`~.soft.SoftmaxBlock`'s function, its MLP keeping less for backward."""
    x = x + block.drop_path(block.attn(block.norm1(x), soft.grid_key_mask(x, regions)))
    return x + block.drop_path(layer_norm_mlp(x, block.norm2, block.mlp)[1])


def _lpi_mix(lpi: nn.Module, normalized: torch.Tensor, padding, norm_weight, norm_bias,
             weight2, bias2) -> torch.Tensor:
    """``conv2(bn(act(conv1(gamma x^ + beta))))`` on a (B, C, H, W) grid, zero
    outside the regions before each convolution."""
    grid = torch.addcmul(norm_bias[:, None, None], normalized, norm_weight[:, None, None])
    if padding is not None:
        grid = grid.masked_fill(padding, 0.)

    hidden = lpi.act(lpi.conv1(grid))
    hidden = batch_norm_once(lpi.bn, hidden)
    if padding is not None:
        hidden = hidden.masked_fill(padding, 0.)
    return F.conv2d(hidden, weight2, bias2, padding=lpi.conv2.padding,
                    groups=lpi.conv2.groups)


def ufo_block(block: nn.Module, x: torch.Tensor, hw_shape,
              regions: Optional[Regions] = None) -> torch.Tensor:
    """:class:`~.ufo_vit.UFOBlock`'s function, keeping less for backward: each
    LayerNorm keeps x^ only, folded into the QKV projection or the recomputed
    local patch interaction; the attention is recomputed; the layer scales fold
    into the output projections."""
    attn, lpi = block.attn, block.lpi
    padding = None if regions is None else regions.padding  # (B, 1, H, W)

    qkv = F.linear(normalize(x, block.norm1.eps), *fold_layer_norm(attn.qkv, block.norm1))
    queries, keys, values = attn.heads(qkv, padding)  # (B, h, N, d) each
    out = recomputed(ufo_vit.ufo_attention, queries, keys, values, attn.gamma_q,
                     attn.gamma_kv, attn.eps).to(values.dtype)
    weight, bias = scaled_weight_and_bias(attn.proj, block.gamma1)
    x = x + block.drop_path(attn.proj_drop(F.linear(merge_heads(out), weight, bias)))

    batch, _, channels = x.shape
    weight2, bias2 = scaled_weight_and_bias(lpi.conv2, block.gamma2)
    if recomputes_locally(lpi.bn):
        normalized = normalize(x, block.norm2.eps)
        grid = normalized.transpose(1, 2).view(batch, channels, *hw_shape)  # a view
        grid = recomputed(partial(_lpi_mix, lpi), grid, padding, block.norm2.weight,
                          block.norm2.bias, weight2, bias2)
        x = x + block.drop_path(grid.flatten(2).transpose(1, 2))
    else:  # a SyncBatchNorm is not rerun
        x = x + block.drop_path(block.gamma2 * lpi(block.norm2(x), hw_shape, padding))

    return x + block.drop_path(layer_norm_mlp(x, block.norm3, block.mlp, block.gamma3)[1])


# Each block runs its twin through its ``twin`` attribute.
ConvPatchEmbed.twin = staticmethod(fused_conv_stack)
soft.SoftBlock.twin = staticmethod(soft_block)
soft.SoftmaxBlock.twin = staticmethod(softmax_block)
ufo_vit.UFOBlock.twin = staticmethod(ufo_block)
