"""Local patch interaction: depth-wise convolutions on the token grid."""
from typing import Tuple

import torch
import torch.nn as nn

from ....utils import check_positive_int


class LocalPatchInteraction(nn.Module):
    """``DWConv -> GELU -> BatchNorm -> DWConv`` on the (H, W) token grid.

    Mixes every token with its spatial neighbours, channel by channel; the
    convolutions are zero-padded to keep the grid size, so any grid works.

    Args:
        embed_dims (int): Token width C.
        kernel_size (int): Odd kernel size of both depth-wise convolutions.
            Default: 3.
        act_layer (type): Activation class. Default: ``nn.GELU``.
    """

    def __init__(self, embed_dims: int, kernel_size: int = 3,
                 act_layer: type = nn.GELU):
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

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """Forward.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.

        Returns:
            Tensor: Shape (B, N, C).
        """
        batch, _, channels = x.shape
        x = x.transpose(1, 2).reshape(batch, channels, *hw_shape)  # (B, C, H, W)
        x = self.conv2(self.bn(self.act(self.conv1(x))))  # (B, C, H, W)
        return x.flatten(2).transpose(1, 2)  # (B, N, C)
