"""Caps the number of bottleneck tokens of SOFT attention.

The capped grid is computed with Python integers and pooled with
``adaptive_avg_pool2d``; :mod:`.traced_bottleneck_pool` is the export
formulation, whose sizes follow a traced input.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def capped_grid_size(height: int, width: int,
                     max_tokens: Optional[int]) -> Tuple[int, int]:
    """Largest grid with the aspect ratio of ``height x width`` and at most
    ``max_tokens`` cells; the grid itself when it is already small enough.

    Args:
        height (int): Rows of the bottleneck grid.
        width (int): Columns of the bottleneck grid.
        max_tokens (int | None): The cap; None disables it.

    Returns:
        tuple[int, int]: (rows, columns) with rows * columns <= max_tokens.
    """
    if max_tokens is None or height * width <= max_tokens:
        return height, width
    scale = math.sqrt(max_tokens / (height * width))
    rows = min(height, max(1, math.floor(height * scale)))
    cols = min(width, max(1, math.floor(width * scale)))
    # Only a side clamped up to 1 can push the product over the cap.
    if rows == 1:
        cols = min(cols, max_tokens)
    if cols == 1:
        rows = min(rows, max_tokens)
    return rows, cols


def cap_bottleneck_grid(grid: torch.Tensor, max_tokens: Optional[int]) -> torch.Tensor:
    """Average-pools a bottleneck grid down to at most ``max_tokens`` cells.

    Args:
        grid (Tensor): Shape (B, d, h, w).
        max_tokens (int | None): The cap; None disables it.

    Returns:
        Tensor: Shape (B, d, h', w') with h' * w' <= max_tokens.
    """
    size = capped_grid_size(grid.shape[-2], grid.shape[-1], max_tokens)
    if size == tuple(grid.shape[-2:]):
        return grid
    return F.adaptive_avg_pool2d(grid, size)
