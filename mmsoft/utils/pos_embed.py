"""Resampling of learned position embeddings between token grids."""
from typing import Tuple

import torch
import torch.nn.functional as F


def interpolate_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                          dst_shape: Tuple[int, int]) -> torch.Tensor:
    """Bilinearly resamples a learned grid of position embeddings.

    Args:
        pos_embed (Tensor): Shape (1, Hs * Ws, C).
        src_shape (tuple[int, int]): The grid (Hs, Ws) it was learned on.
        dst_shape (tuple[int, int]): The grid (H, W) wanted.

    Returns:
        Tensor: Shape (1, H * W, C).
    """
    channels = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, *src_shape, channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_shape, mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                     dst_shape: Tuple[int, int]) -> torch.Tensor:
    """:func:`interpolate_pos_embed` (same arguments and result), returning
    the embeddings themselves on their own grid, where resampling is the
    identity."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    return interpolate_pos_embed(pos_embed, src_shape, dst_shape)
