"""Learned position embeddings on token grids of any size."""
from typing import Tuple

import torch

from ....utils.pos_embed import interpolate_pos_embed, resize_pos_embed
from ...ops.valid_region import ValidShapes, per_distinct_shape, region_tokens_to_grid

__all__ = ['interpolate_pos_embed', 'resize_pos_embed', 'resize_pos_embed_to_regions']


def resize_pos_embed_to_regions(pos_embed: torch.Tensor, src_shape: Tuple[int, int],
                                hw_shape: Tuple[int, int],
                                valid_shapes: ValidShapes) -> torch.Tensor:
    """Position embeddings resized to each image's valid grid, zero outside.

    Every image gets the embeddings it would get alone (resized to its own
    grid), placed top-left on the batch grid.

    Args:
        pos_embed (Tensor): Shape (1, Hs * Ws, C).
        src_shape (tuple[int, int]): The grid (Hs, Ws) it was learned on.
        hw_shape (tuple[int, int]): The batch grid (H, W).
        valid_shapes (list[tuple[int, int]]): Each image's valid (h, w).

    Returns:
        Tensor: Shape (B, H * W, C).
    """
    resized = per_distinct_shape(  # (1, h * w, C) each
        lambda shape: resize_pos_embed(pos_embed, src_shape, shape), valid_shapes)
    return torch.cat([region_tokens_to_grid(resized[shape], shape, hw_shape)
                      for shape in valid_shapes])
