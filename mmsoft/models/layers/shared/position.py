"""Learned position embeddings on token grids of any size."""
from typing import Tuple

import torch
import torch.nn.functional as F


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                     dst_shape: Tuple[int, int]) -> torch.Tensor:
    """Bilinearly resizes a learned grid of position embeddings.

    Args:
        pos_embed (Tensor): Shape (1, Hs * Ws, C).
        src_shape (tuple[int, int]): The grid (Hs, Ws) it was learned on.
        dst_shape (tuple[int, int]): The grid (H, W) wanted.

    Returns:
        Tensor: Shape (1, H * W, C).
    """
    # Traced for ONNX export, ``dst_shape`` holds tensors: resizing to the
    # same grid is the identity (interpolation weights 1 and 0), so the
    # trace always resizes and holds for every input size.
    if not torch.onnx.is_in_onnx_export() and tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    channels = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, *src_shape, channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_shape, mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)
