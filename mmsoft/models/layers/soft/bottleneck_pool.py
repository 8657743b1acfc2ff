"""Caps the number of bottleneck tokens of SOFT attention.

Eager execution computes the capped grid with Python integers and pools with
``adaptive_avg_pool2d``. While the model is traced for ONNX export
(``torch.onnx.is_in_onnx_export()``), the grid sides are traced 0-dim tensors: the
same sizes are then computed branch-free with tensor operations, and the
pooling runs as two averaging-matrix products, so the exported graph follows
the input size instead of freezing the sizes of the example input.
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

    Pooling keeps the cost of SOFT attention linear in the number of pixels:
    with m bounded, the kernel is O(N m d) and the inverse O(m^3).

    Args:
        grid (Tensor): Shape (B, d, h, w).
        max_tokens (int | None): The cap; None disables it.

    Returns:
        Tensor: Shape (B, d, h', w') with h' * w' <= max_tokens.
    """
    if max_tokens is not None and torch.onnx.is_in_onnx_export():
        return traceable_cap_bottleneck_grid(grid, max_tokens)
    size = capped_grid_size(grid.shape[-2], grid.shape[-1], max_tokens)
    if size == tuple(grid.shape[-2:]):
        return grid
    return F.adaptive_avg_pool2d(grid, size)


# --------------------------------------------------------------------------
# The same cap on traced sizes (ONNX export with dynamic input sizes)
# --------------------------------------------------------------------------
def traceable_capped_grid_size(height: torch.Tensor, width: torch.Tensor,
                               max_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`capped_grid_size` on integer tensors, without branches.

    Gives the same sizes as :func:`capped_grid_size` for every grid: the
    scale is computed in float64 with correctly rounded division and square
    root, as Python does, and a grid already within the cap has a scale of at
    least 1, so the clamps return it unchanged.

    Args:
        height (Tensor): Rows of the bottleneck grid, 0-dim int64.
        width (Tensor): Columns of the bottleneck grid, 0-dim int64.
        max_tokens (int): The cap.

    Returns:
        tuple[Tensor, Tensor]: (rows, columns), 0-dim int64.
    """
    cap = torch.tensor(max_tokens, dtype=torch.float64)
    scale = torch.sqrt(cap / (height.to(torch.float64) * width.to(torch.float64)))
    # Truncation is the floor here: both products are positive.
    rows = torch.minimum(height, (height * scale).to(torch.int64).clamp_min(1))
    cols = torch.minimum(width, (width * scale).to(torch.int64).clamp_min(1))
    cols = torch.where(rows == 1, cols.clamp_max(max_tokens), cols)
    rows = torch.where(cols == 1, rows.clamp_max(max_tokens), rows)
    return rows, cols


def averaging_matrix(size_in: torch.Tensor, size_out: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """The bins of adaptive average pooling along one axis, as a matrix.

    Output cell ``i`` averages input cells ``floor(i * n / k)`` up to (not
    including) ``ceil((i + 1) * n / k)``, the bins of
    ``adaptive_avg_pool2d`` for ``n`` inputs and ``k`` outputs.

    Args:
        size_in (Tensor): n, 0-dim int64.
        size_out (Tensor): k, 0-dim int64.
        dtype (torch.dtype): Dtype of the weights.

    Returns:
        Tensor: (k, n); row i holds ``1 / len(bin_i)`` on bin i, 0 elsewhere.
    """
    index = torch.arange(size_out)  # (k, )
    start = torch.div(index * size_in, size_out, rounding_mode='floor')
    end = torch.div((index + 1) * size_in + size_out - 1, size_out,
                    rounding_mode='floor')
    cells = torch.arange(size_in)  # (n, )
    inside = (cells >= start[:, None]) & (cells < end[:, None])  # (k, n)
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def traceable_cap_bottleneck_grid(grid: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """:func:`cap_bottleneck_grid` whose trace holds for every grid size.

    Equal to the eager pooling up to float rounding (the bin averages are
    summed in another order); a grid within the cap is multiplied by
    identity matrices and comes back unchanged.

    Args:
        grid (Tensor): Shape (B, d, h, w).
        max_tokens (int): The cap.

    Returns:
        Tensor: Shape (B, d, h', w'), the sizes of :func:`capped_grid_size`.
    """
    shape = torch._shape_as_tensor(grid)  # (4, ) int64
    height, width = shape[-2], shape[-1]
    rows, cols = traceable_capped_grid_size(height, width, max_tokens)
    pool_rows = averaging_matrix(height, rows, grid.dtype)  # (h', h)
    pool_cols = averaging_matrix(width, cols, grid.dtype)  # (w', w)
    return pool_rows @ grid @ pool_cols.transpose(0, 1)  # (B, d, h', w')
