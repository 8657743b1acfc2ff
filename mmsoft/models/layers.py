"""Modules both models share, in plain PyTorch.

Run-mode switches, the MLP, the convolutional stem, stochastic depth and the
backbone base class with its input checks and timm's model API. The tensor
functions under them are in :mod:`.functional`.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..deprecations import rename_deprecated_keys
from ..utils.validation import (check_choice, check_image_batch, check_out_indices,
                                check_positive_int, check_rate)
from .functional import (ValidShapes, check_valid_shapes, conv_stack,
                         contiguous_gradient, fused_conv_stack, gelu, is_tracing,
                         layer_norm_mlp, memory_format_of, recomputed_mlp,
                         run_block, scaled_weight_and_bias, strided_shapes)


# --- Run-mode switches
def switch_modules(model: nn.Module, mixin: type, attribute: str, enabled: bool,
                   argument: Optional[str] = None) -> nn.Module:
    """Sets ``attribute = enabled`` on every ``mixin`` module of ``model``; returns it.

    Raises:
        ValueError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f'{argument or attribute}={enabled!r} is invalid; expected '
                         f'True or False.')
    for module in model.modules():
        if isinstance(module, mixin):
            setattr(module, attribute, enabled)
    return model


def run_mode(chooser: str, default: bool) -> property:
    """A switch: a bool attribute whose setter calls ``self.<chooser>(enabled)``,
    where the layer binds the functions the mode runs."""
    stored = f'_{chooser}_enabled'

    def get(self) -> bool:
        return getattr(self, stored, default)

    def switch(self, enabled: bool) -> None:
        setattr(self, stored, enabled)
        getattr(self, chooser)(enabled)

    return property(get, switch)


class MemoryEfficient:
    """Mixin: a layer with a memory-saving path beside its plain one, switched
    by ``memory_efficient`` (:func:`set_memory_efficient`)."""

    memory_efficient: bool = True

    def saving_memory(self) -> bool:
        """Whether this call runs the memory-saving path: chosen, autograd
        records (inference runs the plain path, which is faster) and no tracer
        records."""
        return (self.memory_efficient and torch.is_grad_enabled()
                and not is_tracing())


def set_memory_efficient(model: nn.Module, enabled: bool) -> nn.Module:
    """Switches the memory-efficient path of all ``MemoryEfficient`` layers."""
    return switch_modules(model, MemoryEfficient, 'memory_efficient', enabled)


# --- Layers
class GELU(nn.GELU):
    """``nn.GELU()`` (exact) through ``gelu``."""

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return gelu(tensor)


class MLP(MemoryEfficient, nn.Module):
    """``fc2(act(fc1(x)))`` with dropout after ``act`` and ``fc2``.

    Args:
        in_dims: Input and output width C.
        hidden_dims: Hidden width.
        act_layer: Activation class. Default: ``GELU``.
        drop: Dropout rate. Default: 0.
        keep_hidden: Memory-efficient path keeps ``fc1``'s output. Default: True.
    """

    def __init__(self, in_dims: int, hidden_dims: int,
                 act_layer: type = GELU, drop: Optional[float] = 0.,
                 keep_hidden: bool = True):
        super().__init__()
        self.keep_hidden = keep_hidden
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor,
                layer_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(..., C) -> (..., C); ``layer_scale`` (C,) scales the output (in fc2).

        The memory-saving path (``recomputed_mlp``) keeps no activation output.
        """
        weight2, bias2 = scaled_weight_and_bias(self.fc2, layer_scale)
        if self.saving_memory() and not self.dropout_active():
            return recomputed_mlp(x, self.fc1.weight, self.fc1.bias, self.act, weight2,
                                  bias2, self.keep_hidden)
        hidden = self.drop(self.act(self.fc1(x)))  # (..., hidden)
        return self.drop(F.linear(hidden, weight2, bias2))  # (..., C)

    def forward_normed(self, x: torch.Tensor, norm: nn.LayerNorm,
                       layer_scale: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``y = norm(x)`` and ``mlp(y)``: (..., C) -> two (..., C).

        The memory-saving path (``layer_norm_mlp``) keeps only the normalised
        input for backward, neither x nor y.
        """
        if self.saving_memory() and not self.dropout_active():
            weight2, bias2 = scaled_weight_and_bias(self.fc2, layer_scale)
            return layer_norm_mlp(x, norm, self, weight2, bias2)
        x = norm(x)
        return x, self(x, layer_scale)

    def dropout_active(self) -> bool:
        return self.training and self.drop.p > 0


# --- Convolutional stem
class ConvPatchEmbed(MemoryEfficient, nn.Module):
    """Image to tokens through ``Conv3x3(stride) -> BatchNorm2d -> act`` layers.

    A stride-2 layer maps a side L to ceil(L / 2). Layers live in ``self.proj``.

    Args:
        channels: Input channels, then each layer's output channels.
        strides: Stride of each layer.
        act_layer: Activation class. Default: ``nn.ReLU``.
        last_act: Whether the last layer has an activation. Default: True.
    """

    def __init__(self, channels: Sequence[int], strides: Sequence[int],
                 act_layer: type = nn.ReLU, last_act: bool = True):
        super().__init__()
        if len(channels) != len(strides) + 1:
            raise ValueError(f'channels={list(channels)} needs one entry more than '
                             f'strides={list(strides)}.')
        layers = []
        for i, stride in enumerate(strides):
            layers += [
                nn.Conv2d(channels[i], channels[i + 1], 3, stride, padding=1),
                nn.BatchNorm2d(channels[i + 1])
            ]
            if last_act or i < len(strides) - 1:
                layers.append(act_layer())
        self.proj = nn.Sequential(*layers)
        self.strides = tuple(strides)

    def output_shapes(self, valid_shapes: ValidShapes) -> ValidShapes:
        """Valid regions of the output grid, given those of the input."""
        return strided_shapes(valid_shapes, self.strides)

    def forward(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes] = None
                ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C_in, H, W) -> tokens (B, H' * W', C_out) and (H', W').

        Args:
            valid_shapes: Each image's (h, w); output zero outside. Default: None.
        """
        # Channels-last: the convolutions run faster in it, and the tokens
        # (B, H' W', C_out) are the output map itself.
        x = x.contiguous(memory_format=torch.channels_last)
        stack = fused_conv_stack if self.saving_memory() else conv_stack
        x = stack(self.proj, x, valid_shapes)  # (B, C_out, H', W'), channels-last
        # The gradient laid out as the map: CPU batch-norm backward gets a
        # gradient in another layout than its input wrong.
        x = contiguous_gradient(x, memory_format_of(x))
        hw_shape = tuple(x.shape[-2:])
        return x.flatten(2).transpose(1, 2), hw_shape


# --- Backbone base
def init_transformer_weights(module: nn.Module) -> None:
    """Truncated-normal (std 0.02) Linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def tokens_as_map(tokens: torch.Tensor, hw_shape) -> torch.Tensor:
    """Tokens (B, H * W, C) as a channels-last map (B, C, H, W), a view."""
    return tokens.transpose(1, 2).unflatten(2, tuple(hw_shape))


def tokens_to_map(tokens: torch.Tensor, hw_shape) -> torch.Tensor:
    """Tokens (B, H * W, C) -> contiguous NCHW map (B, C, H, W)."""
    batch, _, channels = tokens.shape
    tokens = contiguous_gradient(tokens)
    return tokens.transpose(1, 2).reshape(batch, channels, *hw_shape).contiguous()


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
    """``DropPath(rate)`` for a positive rate, else ``nn.Identity``."""
    return DropPath(rate) if rate > 0 else nn.Identity()


def take_indices(indices: Optional[Union[int, Sequence[int]]],
                 num_outputs: int) -> List[int]:
    """Sorted output indices from timm's ``indices`` (None, last n, or a list).

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
    taken = []
    for index in indices:
        if not -num_outputs <= index < num_outputs:
            raise ValueError(f'indices={list(indices)} is invalid; expected entries '
                             f'in {-num_outputs}..{num_outputs - 1}.')
        taken.append(index % num_outputs)
    return sorted(set(taken))


class DenseBackbone(nn.Module):
    """Base of SOFT and UFO-ViT: input checks, memory path, timm's feature API.

    Subclasses set ``feature_info``, ``num_features`` and ``deprecation_name`` (the
    key of their renamed state-dict keys in ``mmsoft.deprecations``) and implement
    ``forward_maps``, ``forward_intermediates``, ``forward_features`` and
    ``forward_head``.

    Args:
        in_channels: Image channels.
        out_indices: Outputs (0-3) the model is built for.
        num_classes: Classifier outputs (0: none).
        global_pool: ``'token'`` (the class token) or ``''``.
        drop_rate, drop_path_rate: Dropout and stochastic depth rates.
        min_input_size: Smallest accepted image side. Default: 32.
    """

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

    def _classifier(self, num_classes: int) -> nn.Module:
        """Linear head of ``num_classes`` outputs (the identity for 0), on the
        model's device and dtype and in its training mode."""
        if num_classes == 0:
            return nn.Identity().train(self.training)
        reference = next(self.parameters())
        return nn.Linear(self.num_features, num_classes, device=reference.device,
                         dtype=reference.dtype).train(self.training)

    def __prepare_scriptable__(self):
        """Refuses ``torch.jit.script``, which calls this first.

        Raises:
            RuntimeError: Always; TorchScript cannot compile the memory-saving
                autograd functions and the run-mode checks.
        """
        raise RuntimeError(f'{type(self).__name__} cannot be scripted with '
                           f'torch.jit.script; export it with torch.export (or ONNX), '
                           f'or compile it with torch.compile.')

    def init_weights(self) -> None:
        """Initialises every parameter from scratch (``_init_from_scratch``)."""
        self._init_from_scratch()

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Loads keys of earlier layouts too, renamed (``mmsoft.deprecations``)."""
        ours = [key for key in state_dict if key.startswith(prefix)]
        renamed = rename_deprecated_keys({key[len(prefix):]: state_dict.pop(key)
                                          for key in ours}, self.deprecation_name,
                                         stacklevel=4)
        state_dict.update({prefix + key: value for key, value in renamed.items()})
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def select_memory_path(self, memory_efficient: bool, recompute_mlp: bool) -> None:
        """Selects memory-efficient or plain autograd training for every layer.

        Raises:
            ValueError: ``recompute_mlp`` without ``memory_efficient``.
        """
        if recompute_mlp and not memory_efficient:
            raise ValueError(f'recompute_mlp={recompute_mlp!r} needs '
                             f'memory_efficient=True (plain autograd keeps every '
                             f'hidden layer); got memory_efficient='
                             f'{memory_efficient!r}.')
        set_memory_efficient(self, memory_efficient)
        for module in self.modules():
            if isinstance(module, MLP):
                module.keep_hidden = not recompute_mlp

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in backward instead of keeping its tensors
        (here and in every submodule with a ``grad_checkpointing`` switch)."""
        for module in self.modules():
            if hasattr(module, 'grad_checkpointing'):
                module.grad_checkpointing = enable

    def run_block(self, block: nn.Module, x: torch.Tensor, *args) -> torch.Tensor:
        """``block(x, *args)``, checkpointed when gradient checkpointing is on."""
        return run_block(block, x, *args,
                         checkpointing=self.grad_checkpointing and self.training)

    def check_input(self, x: torch.Tensor,
                    valid_shapes: Optional[Sequence] = None) -> Optional[ValidShapes]:
        """Checks images (B, C, H, W); returns valid regions, None if all full.

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

    def check_intermediates_request(self, x: torch.Tensor, indices, output_fmt: str,
                                    valid_shapes: Optional[Sequence]
                                    ) -> Tuple[Optional[ValidShapes], List[int]]:
        """Checks a ``forward_intermediates`` call: its valid regions (None if
        all full) and its sorted output indices (``take_indices``).

        Raises:
            ValueError: An output format other than ``'NCHW'``, or bad input.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt={output_fmt!r} is invalid; expected 'NCHW'.")
        shapes = self.check_input(x, valid_shapes)
        return shapes, take_indices(indices, len(self.feature_info))

    def forward_maps(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes],
                     indices: Sequence[int]) -> List[torch.Tensor]:
        """Feature maps of the outputs ``indices`` (sorted) on checked input."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (or pooled features without a classifier)."""
        return self.forward_head(self.forward_features(x))
