"""The Gaussian kernel of SOFT attention."""
import torch


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise Gaussian kernel ``exp(-||x_i - y_j||^2 / 2)``.

    The squared distance is expanded as ``||x||^2 + ||y||^2 - 2 x.y`` (no
    clamping at zero, as in the reference implementation) and folded into a
    single exponent so that only one (N, M) temporary is materialised.

    Args:
        x (Tensor): Shape (..., N, d).
        y (Tensor): Shape (..., M, d).

    Returns:
        Tensor: Shape (..., N, M).
    """
    half_x_sq = 0.5 * x.pow(2).sum(-1, keepdim=True)  # (..., N, 1)
    half_y_sq = 0.5 * y.pow(2).sum(-1).unsqueeze(-2)  # (..., 1, M)
    exponent = torch.matmul(x, y.transpose(-1, -2))  # (..., N, M)
    exponent = exponent - half_x_sq - half_y_sq
    return exponent.exp_() if not exponent.requires_grad else exponent.exp()
