"""Convolutional patch embedding: a stack of 3x3 conv + BN + activation."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ...memory_efficient.norm_act_conv import fused_conv_stack
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from ...ops.valid_region import ValidShapes, mask_map, strided_shapes


def conv_stack(layers: Sequence[nn.Module], x: torch.Tensor,
               valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """The layers of a stack of convolutions, BatchNorms and activations,
    one after the other.

    With ``valid_shapes`` (regions of the input grid), every Conv2d sees
    zeros outside the regions, which it maps through its stride, and the
    output is zero outside them. (B, C, H, W) -> the last layer's output.
    """
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            x = layer(mask_map(x, valid_shapes))  # (B, C', ceil(H / s), ceil(W / s))
            if valid_shapes is not None:
                valid_shapes = strided_shapes(valid_shapes, layer.stride[:1])
        else:  # BatchNorm, activation
            x = layer(x)
    return mask_map(x, valid_shapes)


class ConvPatchEmbed(MemoryEfficient, nn.Module):
    """Image (or feature map) to tokens through 3x3 convolutions.

    Each layer is ``Conv2d(3x3, stride, padding=1) -> BatchNorm2d -> act``;
    a stride-2 layer maps a side of length L to ceil(L / 2), so any input size
    works without padding. The layers live in ``self.proj`` (an
    ``nn.Sequential``), activations included, so that parameter names follow
    the reference checkpoints (``proj.0``, ``proj.1``, ``proj.3``, ...).

    UFO-ViT's stem (``channels=[C_in, C/8, C/4, C/2, C]``, four stride-2
    layers, ``act_layer=GELU``, ``last_act=False``) computes XCiT's
    ``ConvPatchEmbed`` with biases added to its convolutions
    (``docs/ufo_vit_design.md``).

    Args:
        channels (Sequence[int]): Input channels followed by each layer's
            output channels.
        strides (Sequence[int]): Stride of each layer.
        act_layer (type): Activation class. Default: ``nn.ReLU``.
        last_act (bool): Whether the last layer has an activation.
            Default: True.
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
            x (Tensor): Shape (B, C_in, H, W).
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the input grid. Given, every convolution
                sees zeros outside the regions (as around an image alone)
                and the output is zero there. Default: None.

        Memory-efficient path (:func:`takes_memory_efficient_path`): each
        ``BatchNorm -> activation -> conv`` with a plain BatchNorm2d keeps
        only BatchNorm's input for backward; a SyncBatchNorm runs through
        autograd (:mod:`mmsoft.models.memory_efficient.norm_act_conv`).
        """
        stack = fused_conv_stack if takes_memory_efficient_path(self) else conv_stack
        x = stack(self.proj, x, valid_shapes)  # (B, C_out, H', W')
        hw_shape = tuple(x.shape[-2:])
        return x.flatten(2).transpose(1, 2), hw_shape
