"""What SOFT and UFO-ViT share.

Valid regions of padded batches, recomputation, the MLP, the convolutional
stem (with its training implementation, which keeps only its BatchNorms'
inputs), stochastic depth, and the backbone base class with its input checks
and timm's model API.
"""
import threading
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from ..deprecations import rename_deprecated_keys
from ..ops._library import (apply_without_autocast, autocast_dtype,  # noqa: F401
                            autocast_off, backward_without_autocast, cast_floating,
                            full_precision, is_compiling, is_tracing,
                            records_forward_only)
from ..utils.validation import (check_choice, check_out_indices, check_positive_int,
                                check_rate)

ValidShapes = List[Tuple[int, int]]


# --- Gradient layout and GELU
class ContiguousGradient(torch.autograd.Function):
    """The identity; backward makes the gradient contiguous in a memory format."""

    @staticmethod
    def forward(ctx, tensor, memory_format):
        ctx.memory_format = memory_format
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous(memory_format=ctx.memory_format), None


def memory_format_of(tensor: torch.Tensor) -> torch.memory_format:
    """``channels_last`` for a channels-last 4-d tensor, else ``contiguous_format``."""
    if (tensor.dim() == 4 and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=torch.channels_last)):
        return torch.channels_last
    return torch.contiguous_format


def contiguous_gradient(tensor: torch.Tensor,
                        memory_format=torch.contiguous_format) -> torch.Tensor:
    """``tensor``, whose gradient is made contiguous (in ``memory_format``)."""
    if tensor.requires_grad and not records_forward_only():
        return ContiguousGradient.apply(tensor, memory_format)
    return tensor


def _gelu_backward_ignores_gradient_strides() -> bool:
    """Whether the CPU's exact-GELU backward gets a transposed gradient wrong."""
    with torch.inference_mode(False), torch.enable_grad():
        inputs = torch.linspace(-3, 3, 256).view(2, 8, 16).requires_grad_()
        gradient = torch.linspace(1, 2, 256).view(2, 16, 8).transpose(1, 2)
        strided, = torch.autograd.grad(F.gelu(inputs), inputs, gradient)
        contiguous, = torch.autograd.grad(F.gelu(inputs), inputs, gradient.contiguous())
    return not torch.allclose(strided, contiguous)


#: True where torch's GELU backward needs a gradient laid out as its input
#: (torch 2.1 on x86 CPUs; docs/gpu.md).
GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT = _gelu_backward_ignores_gradient_strides()


def gelu(tensor: torch.Tensor) -> torch.Tensor:
    """The exact ``F.gelu``, its backward given a gradient in its input's layout."""
    out = F.gelu(tensor)
    if GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT:
        out = contiguous_gradient(out, memory_format_of(tensor))
    return out


class GELU(nn.GELU):
    """``nn.GELU()`` (exact) through :func:`gelu`."""

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return gelu(tensor)


# --- Valid regions of a padded batch
def check_valid_shapes(valid_shapes: Sequence,
                       batch_shape: Sequence[int]) -> ValidShapes:
    """One ``(h, w)`` per image of a padded batch (B, C, H, W), as ints.

    Raises:
        ValueError: A wrong count, or a region outside (H, W).
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
    """The regions after convolutions of ``strides``: each side L -> ceil(L / s)."""
    for stride in strides:
        valid_shapes = [(-(-h // stride), -(-w // stride)) for h, w in valid_shapes]
    return valid_shapes


def valid_mask(valid_shapes: ValidShapes, hw_shape: Sequence[int],
               device=None) -> torch.Tensor:
    """(B, H, W) bool, True inside each image's region of the grid."""
    rows = torch.arange(hw_shape[0], device=device)
    cols = torch.arange(hw_shape[1], device=device)
    return torch.stack([(rows < height)[:, None] & (cols < width)[None, :]
                        for height, width in valid_shapes])


class Regions:
    """The valid regions of a padded batch on one grid, with their masks.

    The masks are made once per batch: a stride-s layer's grid keeps ceil(L /
    s) of a side L, whose mask is a strided view of its input's
    (:meth:`strided`). ``cache`` holds what the blocks of one grid share.
    """

    def __init__(self, shapes: ValidShapes, padding: torch.Tensor):
        #: Each image's (h, w).
        self.shapes = shapes
        #: (B, 1, H, W) bool, True outside the image's region.
        self.padding = padding
        self.cache = {}

    @property
    def inside(self) -> torch.Tensor:
        """(B, H * W) bool, True for the tokens inside the image's region."""
        if 'inside' not in self.cache:
            self.cache['inside'] = (~self.padding).flatten(1)
        return self.cache['inside']

    def strided(self, stride: int) -> 'Regions':
        """The regions after a layer of ``stride`` that keeps ceil(L / stride) of a
        side L (a 3x3 convolution with padding 1, a ceil-mode pooling)."""
        if stride == 1:
            return self
        return Regions(strided_shapes(self.shapes, (stride, )),
                       self.padding[..., ::stride, ::stride])

    def upsampled(self, factor: int) -> 'Regions':
        """The regions of a grid ``factor`` times as fine: each side L -> factor L."""
        batch, _, height, width = self.padding.shape
        padding = self.padding[:, :, :, None, :, None].expand(
            batch, 1, height, factor, width, factor)
        return Regions([(h * factor, w * factor) for h, w in self.shapes],
                       padding.reshape(batch, 1, height * factor, width * factor))


def regions_on_grid(valid_shapes: Optional[ValidShapes], hw_shape: Sequence[int],
                    device=None) -> Optional[Regions]:
    """The :class:`Regions` of ``valid_shapes`` on an (H, W) grid; None for None."""
    if valid_shapes is None:
        return None
    return Regions(valid_shapes, ~valid_mask(valid_shapes, hw_shape, device)[:, None])


def mask_map(feature_map: torch.Tensor, regions: Optional[Regions],
             fill: float = 0.) -> torch.Tensor:
    """A map (B, C, H, W) filled with ``fill`` outside the regions (None: as it is)."""
    if regions is None:
        return feature_map
    return feature_map.masked_fill(regions.padding, fill)


def pad_to_grid(feature_map: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Zero-pads (..., h, w) at the bottom and right to (..., H, W)."""
    height, width = feature_map.shape[-2:]
    return F.pad(feature_map, (0, hw_shape[1] - width, 0, hw_shape[0] - height))


def per_distinct_shape(make: Callable, valid_shapes: ValidShapes) -> dict:
    """``{shape: make(shape)}`` for each distinct shape, in first-seen order."""
    made = {}
    for shape in valid_shapes:
        if shape not in made:
            made[shape] = make(shape)
    return made


# --- Recomputation
_STATE = threading.local()


def is_recomputing() -> bool:
    """Whether backward is rerunning a function of :func:`recomputed`."""
    return getattr(_STATE, 'recomputing', False)


@contextmanager
def _recomputing():
    outer = is_recomputing()
    _STATE.recomputing = True
    try:
        yield
    finally:
        _STATE.recomputing = outer


def recomputed(function: Callable, *args):
    """``function(*args)``, rerun in backward instead of keeping its tensors;
    :func:`is_recomputing` is True while it reruns."""
    return checkpoint(function, *args, use_reentrant=False,
                      context_fn=lambda: (nullcontext(), _recomputing()))


def batch_norm_once(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, whose running statistics update once per step: rerun by
    :func:`recomputed`, a BatchNorm moves them by nothing (momentum 0), and
    another norm (a SyncBatchNorm) runs on copies of them."""
    if not (norm.training and is_recomputing()):
        return norm(x)
    if recomputes_locally(norm) and norm.track_running_stats:
        return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight,
                            norm.bias, training=True, momentum=0., eps=norm.eps)
    buffers = {name: buffer.clone() for name, buffer in norm.named_buffers()}
    return functional_call(norm, buffers, (x, ))


def recomputes_locally(norm: nn.Module) -> bool:
    """Whether ``norm`` is a plain BatchNorm2d (a SyncBatchNorm is not rerun)."""
    return type(norm) is nn.BatchNorm2d


# --- Tokens and heads
def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, h * d) -> (B, h, N, d)."""
    batch, tokens, channels = x.shape
    return x.reshape(batch, tokens, num_heads, channels // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    batch, heads, tokens, dims = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * dims)


def tokens_as_map(tokens: torch.Tensor, hw_shape) -> torch.Tensor:
    """Tokens (B, H * W, C) as a channels-last map (B, C, H, W), a view."""
    return tokens.transpose(1, 2).unflatten(2, tuple(hw_shape))


def tokens_to_map(tokens: torch.Tensor, hw_shape) -> torch.Tensor:
    """Tokens (B, H * W, C) -> a contiguous NCHW map (B, C, H, W)."""
    batch, _, channels = tokens.shape
    tokens = contiguous_gradient(tokens)
    return tokens.transpose(1, 2).reshape(batch, channels, *hw_shape).contiguous()


# --- Layers
class MLP(nn.Module):
    """``fc2(act(fc1(x)))`` with dropout; :func:`~mmsoft.ops.layer_norm.layer_norm_mlp`
    keeps ``fc1``'s output for backward where ``keep_hidden``."""

    def __init__(self, in_dims: int, hidden_dims: int, act_layer: type = GELU,
                 drop: float = 0., keep_hidden: bool = True):
        super().__init__()
        self.keep_hidden = keep_hidden
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., C)."""
        hidden = self.drop(self.act(self.fc1(x)))  # (..., hidden)
        return self.drop(self.fc2(hidden))


class MaskedResidual(torch.autograd.Function):
    """``residual + mask o x``; backward ``d residual = G``, ``dx = mask o G``."""

    @staticmethod
    def forward(ctx, residual, x, mask):
        ctx.save_for_backward(mask)
        return torch.addcmul(residual, x, mask)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad * ctx.saved_tensors[0], None


class DropPath(nn.Module):
    """Stochastic depth: drops whole samples of a residual branch in training.

    A backbone draws the masks of all its blocks' branches at once per step
    (:meth:`DenseBackbone.drop_path_masks`) and hands each branch its own;
    called without one, the module draws it."""

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        """x (B, ...) times ``mask`` (B, ): 0 for a dropped sample, else 1 / keep."""
        if not self.training or self.drop_prob == 0.:
            return x

        return x * self._mask(x, mask)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor,
               mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``residual + self(x, mask)``, one kernel forward and one backward."""
        if not self.training or self.drop_prob == 0.:
            return residual + x
        return MaskedResidual.apply(residual, x, self._mask(x, mask))

    def _mask(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``mask`` (B, ) or a new one, shaped to multiply x (B, ...)."""
        if mask is None:
            keep = 1 - self.drop_prob
            mask = x.new_empty(x.shape[0]).bernoulli_(keep).div_(keep)
        return mask.view(-1, *(1, ) * (x.dim() - 1))


def drop_path_or_identity(rate: float) -> nn.Module:
    """``DropPath(rate)`` for a positive rate, else ``nn.Identity()``."""
    return DropPath(rate) if rate > 0 else nn.Identity()


def init_transformer_weights(module: nn.Module) -> None:
    """Truncated-normal (std 0.02) Linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _after(layer: nn.Module, regions: Optional[Regions]) -> Optional[Regions]:
    """The regions after ``layer`` (a stride-s Conv2d keeps ceil(L / s))."""
    if regions is None or not isinstance(layer, nn.Conv2d):
        return regions
    return regions.strided(layer.stride[0])


def conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
               regions: Optional[Regions] = None
               ) -> Tuple[torch.Tensor, Optional[Regions]]:
    """``layers`` in turn, each Conv2d seeing zeros outside the regions; returns
    the output, zero outside its regions, and those."""
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, regions))  # (B, C', ceil(H / s), ceil(W / s))
        else:  # BatchNorm, activation
            x = layer(x)
        regions = _after(layer, regions)
    return mask_map(x, regions), regions


# --- The stem: BatchNorm, activation and convolution
CONVOLUTIONS = (nn.Conv2d, nn.ConvTranspose2d)


def batch_norm_like_forward(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the statistics its forward uses, updating none."""
    batch_stats = norm.training or not norm.track_running_stats
    return F.batch_norm(x, None if batch_stats else norm.running_mean,
                        None if batch_stats else norm.running_var, norm.weight,
                        norm.bias, training=batch_stats, eps=norm.eps)


def _activated(norm: Callable, act: nn.Module, x: torch.Tensor,
               padding: Optional[torch.Tensor]) -> torch.Tensor:
    """``act(norm(x))``, zero where ``padding`` (B, 1, H, W) is True."""
    hidden = act(norm(x))
    return hidden if padding is None else hidden.masked_fill(padding, 0.)


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
    """``conv(act(norm(x)))``, zero outside the regions before ``conv``, keeping
    only x; with ``first``, ``conv(act(norm(first(x))))``, ``first(x)`` recomputed.

    Backward, with ``h = m * act(BN(x))``, ``y = conv(h)`` and G: ``dh =
    conv^T(G)``, ``dW = G * h``, ``db = sum G``; ``dx``, ``d gamma`` and
    ``d beta`` by autograd through ``h`` recomputed with the statistics
    forward used; with ``x = first(u)``: ``du = first^T(dx)``, ``dW_first = dx * u``.
    """

    @staticmethod
    def forward(ctx, x, padding, norm_weight, norm_bias, conv_weight, conv_bias, layers,
                out_dtype, first_weight=None, first_bias=None):
        first, norm, act, conv = layers
        inputs = x
        if first is not None:
            x = convolution(first, inputs, first_weight, first_bias)
        # The running statistics update once, here.
        hidden = _activated(norm, act, norm_input(norm, x), padding).to(out_dtype)

        ctx.save_for_backward(inputs, padding, conv_weight, first_weight, first_bias)
        ctx.layers = layers
        ctx.out_dtype = out_dtype
        if conv is None:
            return hidden
        return convolution(conv, hidden, conv_weight, conv_bias)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        inputs, padding, conv_weight, first_weight, first_bias = ctx.saved_tensors
        first, norm, act, conv = ctx.layers
        x = inputs if first is None else convolution(first, inputs, first_weight,
                                                     first_bias)
        input_dtype = x.dtype
        with torch.enable_grad():
            x = norm_input(norm, x.detach()).requires_grad_()
            hidden = _activated(partial(batch_norm_like_forward, norm), act, x,
                                padding).to(ctx.out_dtype)  # (B, C, H, W)

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
                  conv: Optional[nn.Module] = None,
                  padding: Optional[torch.Tensor] = None,
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
    return apply_without_autocast(NormActConv, x, padding, norm.weight, norm.bias,
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


def fused_conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
                     regions: Optional[Regions] = None
                     ) -> Tuple[torch.Tensor, Optional[Regions]]:
    """:func:`conv_stack` with each ``BN -> act (-> conv)`` fused by
    :func:`norm_act_conv`, and the first convolution where it reads an image."""
    layers = list(layers)
    index, first = 0, None
    if recomputes_first_conv(layers):
        first, x = layers[0], mask_map(x, regions)
        regions = _after(first, regions)
        index = 1

    while index < len(layers):
        layer = layers[index]
        following = _following_conv(layers, index)
        if fusable(layers, index):
            padding = None if following is None or regions is None else regions.padding
            x = norm_act_conv(x, layer, layers[index + 1], following, padding, first)
            first = None
            index += 2
            layer = following
            if layer is None:
                continue
        elif isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, regions))
        else:
            x = layer(x)
        regions = _after(layer, regions)
        index += 1
    return mask_map(x, regions), regions


class ConvPatchEmbed(nn.Module):
    """Image to tokens through ``Conv3x3(stride) -> BatchNorm2d -> act`` layers
    (``proj``), the last without ``act`` unless ``last_act``: ``channels`` are
    the input's and each layer's outputs. A stride-2 layer maps a side L to
    ceil(L / 2). Where ``memory_efficient``, training keeps only the
    BatchNorms' inputs (:func:`fused_conv_stack`)."""

    memory_efficient = True

    def __init__(self, channels: Sequence[int], strides: Sequence[int],
                 act_layer: type = nn.ReLU, last_act: bool = True):
        super().__init__()
        if len(channels) != len(strides) + 1:
            raise ValueError(f'channels={list(channels)} needs one entry more than '
                             f'strides={list(strides)}.')
        layers = []
        for i, stride in enumerate(strides):
            layers += [nn.Conv2d(channels[i], channels[i + 1], 3, stride, padding=1),
                       nn.BatchNorm2d(channels[i + 1])]
            if last_act or i < len(strides) - 1:
                layers.append(act_layer())

        self.proj = nn.Sequential(*layers)
        self.strides = tuple(strides)

    def forward(self, x: torch.Tensor, regions: Optional[Regions] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int], Optional[Regions]]:
        """(B, C_in, H, W) -> tokens (B, H' * W', C_out), (H', W') and the regions
        on that grid; zero outside them."""
        # Channels-last: the convolutions run faster, and the tokens are a view.
        x = x.contiguous(memory_format=torch.channels_last)
        if self.memory_efficient and torch.is_grad_enabled() and not is_tracing():
            x, regions = fused_conv_stack(self.proj, x, regions)  # (B, C_out, H', W')
        else:
            x, regions = conv_stack(self.proj, x, regions)

        # The gradient laid out as the map: CPU batch-norm backward gets a
        # gradient in another layout than its input wrong.
        x = contiguous_gradient(x, memory_format_of(x))
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:]), regions


# --- Backbone base
def check_image_batch(x: torch.Tensor, in_channels: int, min_size: int) -> None:
    """Raises ``ValueError`` unless ``x`` is (B, in_channels, H, W) with H and W
    at least ``min_size``."""
    if x.dim() != 4:
        raise ValueError(f'input must be a 4-D tensor (B, C, H, W); got shape '
                         f'{tuple(x.shape)}.')
    if x.shape[1] != in_channels:
        raise ValueError(f'input has {x.shape[1]} channels but the backbone was '
                         f'built with in_channels={in_channels}; got shape '
                         f'{tuple(x.shape)}.')

    height, width = x.shape[-2:]
    if height < min_size or width < min_size:
        raise ValueError(f'input of size {height}x{width} is too small; both '
                         f'sides must be at least {min_size} pixels.')


def take_indices(indices: Optional[Union[int, Sequence[int]]],
                 num_outputs: int) -> List[int]:
    """Sorted output indices from timm's ``indices``: None, the last n, or a list.

    Raises:
        ValueError: An index outside ``-num_outputs .. num_outputs - 1``.
    """
    if indices is None:
        return list(range(num_outputs))

    if isinstance(indices, int):
        if not 0 < indices <= num_outputs:
            raise ValueError(f'indices={indices} is invalid; expected 1 to '
                             f'{num_outputs} (the last n outputs).')
        return list(range(num_outputs - indices, num_outputs))

    for index in indices:
        if not -num_outputs <= index < num_outputs:
            raise ValueError(f'indices={list(indices)} is invalid; expected entries '
                             f'in {-num_outputs}..{num_outputs - 1}.')
    return sorted({index % num_outputs for index in indices})


def set_memory_efficient(model: nn.Module, enabled: bool) -> nn.Module:
    """Switches every layer's memory-saving path on or off; returns ``model``."""
    if not isinstance(enabled, bool):
        raise ValueError(f'memory_efficient={enabled!r} is invalid; expected True '
                         f'or False.')
    for module in model.modules():
        if hasattr(module, 'memory_efficient'):
            module.memory_efficient = enabled
    return model


class DenseBackbone(nn.Module):
    """The base of SOFT and UFO-ViT: input checks, memory path, timm's model API.
    Subclasses set ``feature_info``, ``num_features`` and ``family`` (their
    earlier state-dict keys' table in ``mmsoft.deprecations``)."""

    family = ''

    def __init__(self, in_channels: int, out_indices: Sequence[int], num_classes: int,
                 global_pool: str, drop_rate: float, drop_path_rate: float,
                 min_input_size: int = 32):
        super().__init__()
        check_positive_int('in_channels', in_channels)
        check_rate('drop_rate', drop_rate)
        check_rate('drop_path_rate', drop_path_rate)
        check_choice('global_pool', global_pool, ('token', ''))

        self.out_indices = check_out_indices(out_indices, 4)
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.min_input_size = min_input_size
        self.drop_path_rate = drop_path_rate
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (or pooled features without a classifier)."""
        return self.forward_head(self.forward_features(x))

    def register_drop_paths(self, rates: Sequence[float], branches: int) -> None:
        """Each block's stochastic-depth rate (one per block, ``branches``
        residual branches each), kept as the probabilities of keeping a sample."""
        self.drop_path_branches = branches
        keep = torch.tensor([1 - rate for rate in rates], dtype=torch.float32)
        self.register_buffer('keep_probs', keep, persistent=False)  # (blocks, )

    def drop_path_masks(self, batch: int) -> Optional[torch.Tensor]:
        """The stochastic-depth masks of every block's branches for a training
        step, drawn at once (two kernels): (blocks, branches, B), 0 for a dropped
        sample, else 1 / keep; None where nothing drops."""
        if not self.training or self.drop_path_rate == 0:
            return None
        keep = self.keep_probs[:, None, None]  # (blocks, 1, 1)
        masks = self.keep_probs.new_empty(len(self.keep_probs), self.drop_path_branches,
                                          batch)
        return masks.bernoulli_(keep).div_(keep)

    def _classifier(self, num_classes: int) -> nn.Module:
        """A Linear head of ``num_classes`` outputs (0: the identity), on the
        model's device and dtype and in its training mode."""
        if num_classes == 0:
            return nn.Identity().train(self.training)
        reference = next(self.parameters())
        return nn.Linear(self.num_features, num_classes, device=reference.device,
                         dtype=reference.dtype).train(self.training)

    def select_memory_path(self, memory_efficient: bool, recompute_mlp: bool) -> None:
        """The memory-saving or plain path for every layer.

        Raises:
            ValueError: ``recompute_mlp`` without ``memory_efficient``.
        """
        if recompute_mlp and not memory_efficient:
            raise ValueError(f'recompute_mlp={recompute_mlp!r} needs '
                             f'memory_efficient=True (plain autograd keeps every '
                             f'hidden layer); got '
                             f'memory_efficient={memory_efficient!r}.')

        set_memory_efficient(self, memory_efficient)
        for module in self.modules():
            if isinstance(module, MLP):
                module.keep_hidden = not recompute_mlp

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in backward instead of keeping its tensors."""
        for module in self.modules():
            if hasattr(module, 'grad_checkpointing'):
                module.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def init_weights(self) -> None:
        """Initialises every parameter from scratch."""
        self._init_from_scratch()

    def check_input(self, x: torch.Tensor,
                    valid_shapes: Optional[Sequence] = None) -> Optional[ValidShapes]:
        """Checks images (B, C, H, W); returns their regions, None if all are whole.

        Raises:
            ValueError: Wrong channels, too small images or regions not fitting ``x``.
        """
        check_image_batch(x, self.in_channels, self.min_input_size)
        if valid_shapes is None:
            return None

        shapes = check_valid_shapes(valid_shapes, x.shape)

        if all(shape == tuple(x.shape[-2:]) for shape in shapes):
            return None
        return shapes

    def intermediates_request(self, x: torch.Tensor, indices, output_fmt: str,
                              valid_shapes: Optional[Sequence]
                              ) -> Tuple[Optional[ValidShapes], List[int]]:
        """The checked regions and sorted output indices of ``forward_intermediates``.

        Raises:
            ValueError: An output format other than ``'NCHW'``, or bad input.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt={output_fmt!r} is invalid; expected 'NCHW'.")
        shapes = self.check_input(x, valid_shapes)
        return shapes, take_indices(indices, len(self.feature_info))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Loads the keys of earlier layouts too, renamed."""
        ours = [key for key in state_dict if key.startswith(prefix)]
        renamed = rename_deprecated_keys(
            {key[len(prefix):]: state_dict.pop(key) for key in ours}, self.family,
            stacklevel=4)
        state_dict.update({prefix + key: value for key, value in renamed.items()})
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __prepare_scriptable__(self):
        """Refuses ``torch.jit.script``, which calls this first.

        Raises:
            RuntimeError: Always: TorchScript cannot compile the memory-saving
                autograd functions.
        """
        raise RuntimeError(f'{type(self).__name__} cannot be scripted with '
                           f'torch.jit.script; export it with torch.export (or ONNX), '
                           f'or compile it with torch.compile.')
