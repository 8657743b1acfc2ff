"""Local patch interaction: depth-wise convolutions on the token grid."""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ....utils import check_positive_int
from ...memory_efficient.recompute import (batch_norm_once, recomputed_local_mixing,
                                           recomputes_locally)
from ...memory_efficient.switch import MemoryEfficient
from ..shared.gelu import GELU
from ...ops.valid_region import ValidShapes, mask_map


class LocalPatchInteraction(MemoryEfficient, nn.Module):
    """``DWConv -> GELU -> BatchNorm -> DWConv`` on the (H, W) token grid.

    Mixes every token with its spatial neighbours, channel by channel; the
    convolutions are zero-padded to keep the grid size, so any grid works.

    This is XCiT's ``LPI`` (timm ``xcit.py``; same parameter names
    ``conv1``, ``bn``, ``conv2``, same output for its weights). Deliberate
    additions, not in XCiT: ``valid_shapes`` (in a padded batch both
    convolutions see zeros outside an image's region, so its valid tokens
    are those it has alone; XCiT mixes the padding tokens into the border
    tokens) and the check that the kernel is odd (XCiT's padding ``k // 2``
    would change the grid size otherwise). See ``tests/test_ufo_vit_vs_xcit.py``.

    Memory-efficient path (:meth:`saves_memory`, with a plain BatchNorm2d:
    a SyncBatchNorm keeps autograd's path): backward recomputes the three
    intermediate maps from the input instead of keeping them, without
    updating BatchNorm's running statistics a second time
    (:func:`~mmsoft.models.memory_efficient.recompute.recomputed_local_mixing`).

    Args:
        embed_dims (int): Token width C.
        kernel_size (int): Odd kernel size of both depth-wise convolutions.
            Default: 3.
        act_layer (type): Activation class. Default: mmsoft's exact GELU
            (:class:`~mmsoft.models.layers.shared.gelu.GELU`).
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
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Forward.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid: both convolutions then see zeros
                outside it, as around the image alone. Default: None.

        Returns:
            Tensor: Shape (B, N, C).
        """
        batch, _, channels = x.shape
        grid = x.transpose(1, 2).reshape(batch, channels, *hw_shape)  # (B, C, H, W)
        if self.recomputes(grid):
            grid = recomputed_local_mixing(self, grid, valid_shapes)
        else:  # conv2(bn(act(conv1(grid)))), zero outside the valid regions
            grid = self.conv2(self.conv2_input(grid, valid_shapes))
        return grid.flatten(2).transpose(1, 2)  # (B, N, C)

    def recomputes(self, grid: torch.Tensor) -> bool:
        """Whether :meth:`forward` takes the memory-efficient path on
        ``grid``: the switch is on, autograd records, and ``bn`` is a plain
        BatchNorm2d."""
        return (self.saves_memory(grid, self.conv1.weight)
                and recomputes_locally(self.bn))

    def conv2_input(self, grid: torch.Tensor,
                    valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """``bn(act(conv1(grid)))``, the input of ``conv2``; a rerun by a
        checkpoint updates no running statistics.

        Args:
            grid (Tensor): Shape (B, C, H, W).
            valid_shapes (list[tuple[int, int]], optional): Valid regions;
                ``conv1``'s input and the output are zeroed outside them.
                Default: None.

        Returns:
            Tensor: Shape (B, C, H, W).
        """
        hidden = self.act(self.conv1(mask_map(grid, valid_shapes)))
        return mask_map(batch_norm_once(self.bn)(hidden), valid_shapes)
