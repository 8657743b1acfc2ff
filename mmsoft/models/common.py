"""What SOFT and UFO-ViT share.

Mixed precision, valid regions of padded batches, the MLP, the convolutional
stem, stochastic depth, and the backbone base class with its input checks
and timm's model API. The memory-saving twins are in :mod:`.memory_efficient`.
"""
import importlib
import threading
from contextlib import contextmanager, nullcontext
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from ..deprecations import rename_deprecated_keys
from ..utils.validation import (check_choice, check_out_indices, check_positive_int,
                                check_rate)

ValidShapes = List[Tuple[int, int]]


# --- Tracing and mixed precision
if hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
    is_compiling = torch.compiler.is_compiling
else:  # torch < 2.3
    is_compiling = importlib.import_module('torch._dynamo').is_compiling


def records_forward_only() -> bool:
    """Whether ``torch.jit.trace`` or the ONNX exporter is recording."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def is_tracing() -> bool:
    """Whether a tracer or ``torch.compile`` is recording: the plain path runs."""
    return records_forward_only() or is_compiling()


# torch >= 2.4: the autocast queries take a device type.
_AUTOCAST_QUERY_TAKES_DEVICE = hasattr(torch, 'get_autocast_dtype')


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts to on ``device_type``; None when it is off."""
    if device_type == 'meta':
        return None

    if _AUTOCAST_QUERY_TAKES_DEVICE:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if device_type == 'cuda' and torch.is_autocast_enabled():
        return torch.get_autocast_gpu_dtype()
    return None


def autocast_off(device_type: str):
    """Autocast switched off on ``device_type`` (``'meta'`` has none)."""
    if device_type == 'meta':
        return nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """float16 and bfloat16 tensors as float32; others as they are."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def cast_floating(value, dtype: torch.dtype):
    """A float16, bfloat16 or float32 tensor in ``dtype``; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in (
            torch.float16, torch.bfloat16, torch.float32):
        return value.to(dtype)
    return value


def _device_type(values) -> str:
    return next((value.device.type for value in values
                 if isinstance(value, torch.Tensor)), 'cpu')


def apply_without_autocast(function: type, *args, cast_to: Optional[str] = 'float32'):
    """``function.apply(*args)`` with autocast off.

    Under autocast its floating inputs are cast first: to float32, or with
    ``cast_to='autocast'`` to autocast's dtype (None: left as they are).
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
    """Runs an autograd function's ``backward`` with autocast off."""

    def run(ctx, *grads):
        with autocast_off(_device_type(grads)):
            return backward(ctx, *grads)

    run.__doc__ = backward.__doc__
    return run


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
def check_valid_shapes(valid_shapes: Sequence, batch_shape: Sequence[int]) -> ValidShapes:
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


def mask_map(feature_map: torch.Tensor, valid_shapes: Optional[ValidShapes],
             fill: float = 0.) -> torch.Tensor:
    """A map (B, C, H, W) filled with ``fill`` outside the regions (None: as it is)."""
    if valid_shapes is None:
        return feature_map
    inside = valid_mask(valid_shapes, feature_map.shape[-2:], feature_map.device)
    return feature_map.masked_fill(~inside[:, None], fill)


class Regions(NamedTuple):
    """The valid regions of a padded batch on one grid of tokens."""

    #: Each image's (h, w).
    shapes: ValidShapes
    #: (B, 1, H, W) bool, True outside the image's region.
    padding: torch.Tensor


def regions_on_grid(valid_shapes: Optional[ValidShapes], hw_shape: Sequence[int],
                    device=None) -> Optional[Regions]:
    """The :class:`Regions` of ``valid_shapes`` on an (H, W) grid; None for None."""
    if valid_shapes is None:
        return None
    return Regions(valid_shapes, ~valid_mask(valid_shapes, hw_shape, device)[:, None])


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
    """``fc2(act(fc1(x)))`` with dropout; its twin keeps ``fc1``'s output for
    backward where ``keep_hidden``."""

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


class DropPath(nn.Module):
    """Stochastic depth: drops whole samples of a residual branch in training."""

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.:
            return x

        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


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


def conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
               valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """``layers`` in turn; each Conv2d sees zeros outside ``valid_shapes``."""
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, valid_shapes))  # (B, C', ceil(H / s), ceil(W / s))
            if valid_shapes is not None:
                valid_shapes = strided_shapes(valid_shapes, layer.stride[:1])
        else:  # BatchNorm, activation
            x = layer(x)
    return mask_map(x, valid_shapes)


class ConvPatchEmbed(nn.Module):
    """Image to tokens through ``Conv3x3(stride) -> BatchNorm2d -> act`` layers
    (``proj``), the last without ``act`` unless ``last_act``: ``channels`` are
    the input's and each layer's outputs. A stride-2 layer maps a side L to
    ceil(L / 2)."""

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

    def output_shapes(self, valid_shapes: ValidShapes) -> ValidShapes:
        """The valid regions of the output grid, given those of the input."""
        return strided_shapes(valid_shapes, self.strides)

    def forward(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C_in, H, W) -> tokens (B, H' * W', C_out) and (H', W'); zero outside
        ``valid_shapes``."""
        # Channels-last: the convolutions run faster, and the tokens are a view.
        x = x.contiguous(memory_format=torch.channels_last)
        stack = conv_stack  # its twin: memory_efficient.fused_conv_stack
        if self.memory_efficient and torch.is_grad_enabled() and not is_tracing():
            stack = self.twin
        x = stack(self.proj, x, valid_shapes)  # (B, C_out, H', W')

        # The gradient laid out as the map: CPU batch-norm backward gets a
        # gradient in another layout than its input wrong.
        x = contiguous_gradient(x, memory_format_of(x))
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])


# --- Backbone base
def check_image_batch(x: torch.Tensor, in_channels: int, min_size: int) -> None:
    """Raises ``ValueError`` unless ``x`` is (B, in_channels, H, W), H, W >= min_size."""
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
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (or pooled features without a classifier)."""
        return self.forward_head(self.forward_features(x))

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
                             f'hidden layer); got memory_efficient={memory_efficient!r}.')

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
