"""The valid (unpadded) region of each image of a padded batch.

mmdet and mmseg pad every image of a batch at the bottom and right to a
common size. A valid region is the top-left ``(h, w)`` of an image on a grid
(pixels or tokens); ``valid_shapes`` lists one per image. The helpers below
follow the regions through the layers, zero what lies outside them (so that
a convolution sees there the zero padding it would see around the image
alone) and move maps between an image's own grid and the batch grid.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

ValidShapes = List[Tuple[int, int]]


def check_valid_shapes(valid_shapes: Sequence, batch_shape: Sequence[int]) -> ValidShapes:
    """Validates per-image valid regions against a padded batch.

    Args:
        valid_shapes (Sequence): One ``(h, w)`` per image.
        batch_shape (Sequence[int]): The batch's shape (B, C, H, W).

    Returns:
        list[tuple[int, int]]: The regions as tuples of Python ints.

    Raises:
        ValueError: Naming the value and what is accepted.
    """
    batch, height, width = batch_shape[0], batch_shape[-2], batch_shape[-1]
    shapes = [tuple(int(side) for side in shape) for shape in valid_shapes]
    if len(shapes) != batch:
        raise ValueError(f'valid_shapes={shapes} has {len(shapes)} entries; expected '
                         f'one (h, w) per image of the batch of {batch}.')
    for shape in shapes:
        if len(shape) != 2 or not (0 < shape[0] <= height and 0 < shape[1] <= width):
            raise ValueError(f'valid_shapes={shapes} is invalid; expected (h, w) '
                             f'with 0 < h <= {height} and 0 < w <= {width}, the '
                             f'padded batch size.')
    return shapes


def strided_shapes(valid_shapes: ValidShapes, strides: Sequence[int]) -> ValidShapes:
    """Regions after convolutions of the given strides (padding k // 2, odd
    k, or kernel = stride): a side L becomes ``ceil(L / s)`` at each.

    Args:
        valid_shapes (list[tuple[int, int]]): Regions before.
        strides (Sequence[int]): Stride of each convolution.

    Returns:
        list[tuple[int, int]]: Regions after.
    """
    shapes = valid_shapes
    for stride in strides:
        shapes = [(-(-h // stride), -(-w // stride)) for h, w in shapes]
    return shapes


def scaled_shapes(valid_shapes: ValidShapes, factor: int) -> ValidShapes:
    """Regions after upsampling by ``factor``: (h, w) -> (h * f, w * f)."""
    return [(h * factor, w * factor) for h, w in valid_shapes]


def per_distinct_shape(make: Callable[[Tuple[int, int]], torch.Tensor],
                       valid_shapes: ValidShapes
                       ) -> Dict[Tuple[int, int], torch.Tensor]:
    """``make(shape)`` once for each distinct shape of ``valid_shapes``, in
    order of first appearance (a loop, not a ``set``: compilers follow it).

    Args:
        make (callable): Tensor of one (h, w) shape.
        valid_shapes (list[tuple[int, int]]): Each image's valid (h, w).

    Returns:
        dict: shape -> ``make(shape)``.
    """
    made = {}
    for shape in valid_shapes:
        if shape not in made:
            made[shape] = make(shape)
    return made


def valid_mask(valid_shapes: ValidShapes, hw_shape: Sequence[int],
               device=None) -> torch.Tensor:
    """True inside each image's region of an (H, W) grid: (B, H, W) bool.

    Made on ``device`` from comparisons with the Python sizes: no tensor is
    copied from the host (a blocking copy on CUDA).
    """
    rows = torch.arange(hw_shape[0], device=device)  # (H, )
    cols = torch.arange(hw_shape[1], device=device)  # (W, )
    return torch.stack([(rows < height)[:, None] & (cols < width)[None, :]
                        for height, width in valid_shapes])  # (B, H, W)


def mask_map(feature_map: torch.Tensor, valid_shapes: Optional[ValidShapes],
             fill: float = 0.) -> torch.Tensor:
    """``fill`` outside each image's region; the map itself when None.

    Args:
        feature_map (Tensor): Shape (B, C, H, W).
        valid_shapes (list[tuple[int, int]] | None): Regions on that grid.
        fill (float): Value outside the regions. Default: 0.

    Returns:
        Tensor: Shape (B, C, H, W).
    """
    if valid_shapes is None:
        return feature_map
    inside = valid_mask(valid_shapes, feature_map.shape[-2:], feature_map.device)
    return feature_map.masked_fill(~inside[:, None], fill)


def pad_to_grid(feature_map: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Zero-pads a map at the bottom and right to (H, W).

    Args:
        feature_map (Tensor): Shape (..., h, w), h <= H, w <= W.
        hw_shape (tuple[int, int]): The grid (H, W).

    Returns:
        Tensor: Shape (..., H, W).
    """
    height, width = feature_map.shape[-2:]
    return F.pad(feature_map, (0, hw_shape[1] - width, 0, hw_shape[0] - height))


def tokens_of_region(tokens: torch.Tensor, hw_shape: Sequence[int],
                     shape: Tuple[int, int]) -> torch.Tensor:
    """The tokens of the top-left ``shape`` of a grid, in raster order.

    Args:
        tokens (Tensor): Shape (..., H * W, C).
        hw_shape (tuple[int, int]): The grid (H, W).
        shape (tuple[int, int]): The region (h, w).

    Returns:
        Tensor: Shape (..., h * w, C).
    """
    grid = tokens.unflatten(-2, tuple(hw_shape))  # (..., H, W, C)
    return grid[..., :shape[0], :shape[1], :].flatten(-3, -2)


def region_tokens_to_grid(tokens: torch.Tensor, shape: Tuple[int, int],
                          hw_shape: Sequence[int]) -> torch.Tensor:
    """Inverse of :func:`tokens_of_region`, zeros outside the region.

    Args:
        tokens (Tensor): Shape (..., h * w, C).
        shape (tuple[int, int]): The region (h, w).
        hw_shape (tuple[int, int]): The grid (H, W).

    Returns:
        Tensor: Shape (..., H * W, C).
    """
    grid = tokens.unflatten(-2, tuple(shape)).movedim(-1, -3)  # (..., C, h, w)
    return pad_to_grid(grid, hw_shape).flatten(-2).transpose(-1, -2)
