"""SOFT's bottleneck cap with sizes that follow a traced input.

Traced for ONNX export with dynamic height and width, sizes are 0-dim
tensors: Python arithmetic on them freezes the example input's sizes into
the graph. :func:`traceable_cap_bottleneck_grid` is the export formulation
(:class:`~mmsoft.models.tracing.Exportable`) of
:func:`~mmsoft.models.layers.soft.bottleneck_pool.cap_bottleneck_grid`: its
sizes come from :func:`traceable_capped_grid_size`, branch-free, and its
pooling is two averaging-matrix products (ONNX's pooling has no adaptive
bins).
"""
from typing import Optional, Tuple

import torch


def traceable_capped_grid_size(height: torch.Tensor, width: torch.Tensor,
                               max_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``capped_grid_size`` on integer tensors, without branches.

    Gives the same sizes as
    :func:`~mmsoft.models.layers.soft.bottleneck_pool.capped_grid_size` for
    every grid: the scale is computed in float64 with correctly rounded
    division and square root, as Python does, and a grid already within the
    cap has a scale of at least 1, so the clamps return it unchanged.

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
                     dtype: torch.dtype, device=None) -> torch.Tensor:
    """The bins of adaptive average pooling along one axis, as a matrix.

    Output cell ``i`` averages input cells ``floor(i * n / k)`` up to (not
    including) ``ceil((i + 1) * n / k)``, the bins of
    ``adaptive_avg_pool2d`` for ``n`` inputs and ``k`` outputs.

    Args:
        size_in (Tensor): n, 0-dim int64.
        size_out (Tensor): k, 0-dim int64.
        dtype (torch.dtype): Dtype of the weights.
        device (torch.device, optional): Device of the weights (the pooled
            map's). Default: None (the CPU).

    Returns:
        Tensor: (k, n); row i holds ``1 / len(bin_i)`` on bin i, 0 elsewhere.
    """
    index = torch.arange(size_out, device=device)  # (k, )
    start = torch.div(index * size_in, size_out, rounding_mode='floor')
    end = torch.div((index + 1) * size_in + size_out - 1, size_out,
                    rounding_mode='floor')
    cells = torch.arange(size_in, device=device)  # (n, )
    inside = (cells >= start[:, None]) & (cells < end[:, None])  # (k, n)
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def traceable_cap_bottleneck_grid(grid: torch.Tensor,
                                  max_tokens: Optional[int]) -> torch.Tensor:
    """``cap_bottleneck_grid`` whose trace holds for every grid size.

    Equal to the eager pooling up to float rounding (the bin averages are
    summed in another order); a grid within the cap is multiplied by
    identity matrices and comes back unchanged.

    Args:
        grid (Tensor): Shape (B, d, h, w).
        max_tokens (int | None): The cap; None keeps the grid.

    Returns:
        Tensor: Shape (B, d, h', w'), the sizes of ``capped_grid_size``.
    """
    if max_tokens is None:
        return grid
    shape = torch._shape_as_tensor(grid)  # (4, ) int64
    height, width = shape[-2], shape[-1]
    rows, cols = traceable_capped_grid_size(height, width, max_tokens)
    pool_rows = averaging_matrix(height, rows, grid.dtype, grid.device)  # (h', h)
    pool_cols = averaging_matrix(width, cols, grid.dtype, grid.device)  # (w', w)
    return pool_rows @ grid @ pool_cols.transpose(0, 1)  # (B, d, h', w')
