"""Resize hook for learned position embeddings of another image size.

Position embeddings of shape (1, E + H*W, C) hold E leading extra entries
(e.g. a class token's), then an H x W grid.
"""
import math
from typing import Callable, Mapping, Optional, Tuple

import torch

from .strict import ResizeHook

#: Position-embedding key -> (the model's grid (H, W), leading extra entries).
PosEmbedGrids = Mapping[str, Tuple[Tuple[int, int], int]]
#: The model's resize of grid embeddings: (1, Hs * Ws, C), (Hs, Ws), (H, W) ->
#: (1, H * W, C), e.g. :func:`mmsoft.models.soft.resize_pos_embed`.
GridResize = Callable[[torch.Tensor, Tuple[int, int], Tuple[int, int]], torch.Tensor]
#: Note added to shape-mismatch errors of loaders using the hook.
RESIZE_NOTE = ('(position embeddings are resized only from a square grid of the '
               'same width.)')


def square_side(tokens: int) -> Optional[int]:
    """``s`` with ``s * s == tokens``, or None when ``tokens`` is no square."""
    side = math.isqrt(tokens)
    return side if side * side == tokens else None


def checkpoint_grid_side(value: torch.Tensor, target: torch.Tensor,
                         num_extra: int) -> Optional[int]:
    """Side of the square grid a checkpoint's position embeddings hold.

    Args:
        value (Tensor): The checkpoint's, (1, E + S*S, C).
        target (Tensor): The model's, (1, E + H*W, C).
        num_extra (int): E, the leading entries outside the grid.

    Returns:
        int | None: S, or None when ``value`` cannot be resized to
        ``target`` (another layout or width, no square grid).
    """
    if value.dim() != 3 or value.shape[0] != 1 or value.shape[2] != target.shape[2]:
        return None
    if value.shape[1] < num_extra:
        return None
    return square_side(value.shape[1] - num_extra)


def resize_grid_pos_embed(value: torch.Tensor, side: int, grid: Tuple[int, int],
                          num_extra: int, resize: GridResize) -> torch.Tensor:
    """Bilinearly resizes the grid part of position embeddings.

    Args:
        value (Tensor): Shape (1, E + side*side, C).
        side (int): Side of its square grid.
        grid (tuple[int, int]): The grid (H, W) wanted.
        num_extra (int): E, the leading entries kept as they are.
        resize (callable): The model's resize of grid embeddings.

    Returns:
        Tensor: Shape (1, E + H*W, C), of ``value``'s dtype.
    """
    extra, tokens = value[:, :num_extra], value[:, num_extra:]
    resized = resize(tokens.float(), (side, side), grid).to(value.dtype)
    return torch.cat((extra, resized), dim=1)


def grid_pos_embed_resizer(grids: PosEmbedGrids, interpolate: GridResize) -> ResizeHook:
    """The resize hook for a model's learned position embeddings.

    Args:
        grids (Mapping): State-dict key of each position-embedding tensor ->
            (the model's grid (H, W), number of leading extra entries).
        interpolate (callable): The model's resize of grid embeddings (the
            checkpoint code imports no model).

    Returns:
        Callable: ``resize(key, checkpoint_tensor, model_tensor)`` giving the
        resized tensor, or None for another key or a tensor it cannot resize.
    """

    def resize(key: str, value: torch.Tensor,
               target: torch.Tensor) -> Optional[torch.Tensor]:
        if key not in grids:
            return None
        grid, num_extra = grids[key]
        side = checkpoint_grid_side(value, target, num_extra)
        if side is None:
            return None
        return resize_grid_pos_embed(value, side, grid, num_extra, interpolate)

    return resize
