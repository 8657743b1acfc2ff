"""SOFT's bottleneck cap in ONNX's operators, on sizes that follow the traced
input: what SOFT attention's export formulation runs."""
from typing import Optional, Tuple

import torch


def traceable_capped_grid_size(height: torch.Tensor, width: torch.Tensor,
                               max_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``capped_grid_size`` on 0-dim int64 tensors, without branches."""
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
    """Adaptive average pooling of n cells to k as a (k, n) matrix: row i is
    ``1 / len(bin_i)`` on ``[floor(i n / k), ceil((i + 1) n / k))``."""
    index = torch.arange(size_out, device=device)  # (k, )
    start = torch.div(index * size_in, size_out, rounding_mode='floor')
    end = torch.div((index + 1) * size_in + size_out - 1, size_out,
                    rounding_mode='floor')
    cells = torch.arange(size_in, device=device)  # (n, )
    inside = (cells >= start[:, None]) & (cells < end[:, None])  # (k, n)
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def traceable_cap_bottleneck_grid(grid: torch.Tensor,
                                  max_tokens: Optional[int]) -> torch.Tensor:
    """``cap_bottleneck_grid`` as matrix products, for any grid size."""
    if max_tokens is None:
        return grid
    shape = torch._shape_as_tensor(grid)  # (4, ) int64
    height, width = shape[-2], shape[-1]
    rows, cols = traceable_capped_grid_size(height, width, max_tokens)
    pool_rows = averaging_matrix(height, rows, grid.dtype, grid.device)  # (h', h)
    pool_cols = averaging_matrix(width, cols, grid.dtype, grid.device)  # (w', w)
    return pool_rows @ grid @ pool_cols.transpose(0, 1)  # (B, d, h', w')
