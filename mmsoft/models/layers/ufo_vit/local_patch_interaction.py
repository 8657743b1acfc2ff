"""Local patch interaction: depth-wise convolutions on the token grid."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ....utils import check_positive_int
from ...memory_efficient.recompute import (batch_norm_once, recomputed,
                                           recomputes_locally)
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from ...ops.valid_region import ValidShapes, mask_map
from ..shared.gelu import GELU
from ..shared.layer_scale import scaled_weight_and_bias


class LocalPatchInteraction(MemoryEfficient, nn.Module):
    """``DWConv -> GELU -> BatchNorm -> DWConv`` on the (H, W) token grid.

    Mixes every token with its spatial neighbours, channel by channel; the
    convolutions are zero-padded to keep the grid size, so any grid works.
    Parameter names ``conv1``, ``bn``, ``conv2`` are those of XCiT's ``LPI``
    (``docs/ufo_vit_design.md``).

    Memory-efficient path (:func:`takes_memory_efficient_path`, and ``bn`` a
    plain BatchNorm2d: a SyncBatchNorm's statistics span the processes, so
    it keeps autograd's path): backward recomputes the three intermediate
    maps from the input instead of keeping them, without updating
    BatchNorm's running statistics a second time
    (:func:`~mmsoft.models.memory_efficient.recompute.recomputed`).

    Args:
        embed_dims (int): Token width C.
        kernel_size (int): Odd kernel size of both depth-wise convolutions.
            Default: 3.
        act_layer (type): Activation class. Default: mmsoft's exact GELU
            (:class:`~mmsoft.models.layers.shared.gelu.GELU`).

    Raises:
        ValueError: If ``embed_dims`` or ``kernel_size`` is not a positive
            integer, or ``kernel_size`` is even.
    """

    def __init__(self, embed_dims: int, kernel_size: int = 3,
                 act_layer: type = GELU):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f'kernel_size={kernel_size} is invalid; expected an '
                             f'odd integer so that the grid keeps its size.')
        padding = kernel_size // 2
        self.conv1 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(embed_dims)
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None,
                layer_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``layer_scale * conv2(bn(act(conv1(x))))`` on the token grid.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid: both convolutions then see zeros
                outside it, as around the image alone. Default: None.
            layer_scale (Tensor, optional): Per-channel output scale, shape
                (C, ), folded into ``conv2``'s weight and bias. Default: None.

        Returns:
            Tensor: Shape (B, N, C).
        """
        batch, _, channels = x.shape
        grid = x.transpose(1, 2).reshape(batch, channels, *hw_shape)  # (B, C, H, W)
        weight2, bias2 = scaled_weight_and_bias(self.conv2, layer_scale)
        if takes_memory_efficient_path(self) and recomputes_locally(self.bn):
            grid = recomputed(self.mix, grid, weight2, bias2, valid_shapes)
        else:
            grid = self.mix(grid, weight2, bias2, valid_shapes)
        return grid.flatten(2).transpose(1, 2)  # (B, N, C)

    def mix(self, grid: torch.Tensor, weight2: torch.Tensor,
            bias2: Optional[torch.Tensor],
            valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """``conv2(bn(act(conv1(grid))))`` with ``conv2``'s weight and bias
        given; a rerun by a checkpoint updates no running statistics.

        Args:
            grid (Tensor): Shape (B, C, H, W).
            weight2 (Tensor): ``conv2``'s weight, shape (C, 1, k, k).
            bias2 (Tensor, optional): ``conv2``'s bias, shape (C, ).
            valid_shapes (list[tuple[int, int]], optional): Valid regions;
                ``conv1``'s and ``conv2``'s inputs are zeroed outside them.
                Default: None.

        Returns:
            Tensor: Shape (B, C, H, W).
        """
        hidden = self.act(self.conv1(mask_map(grid, valid_shapes)))  # (B, C, H, W)
        hidden = mask_map(batch_norm_once(self.bn)(hidden), valid_shapes)
        return F.conv2d(hidden, weight2, bias2, padding=self.conv2.padding,
                        groups=self.conv2.groups)  # (B, C, H, W)
