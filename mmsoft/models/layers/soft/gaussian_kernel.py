"""The Gaussian kernel of SOFT attention."""
import torch


def _lift(points: torch.Tensor, norm_first: bool) -> torch.Tensor:
    """Appends ``-||p||^2 / 2`` and ``1`` to each point: (..., n, d + 2).

    With ``x' = [x, 1, -||x||^2/2]`` and ``y' = [y, -||y||^2/2, 1]``,
    ``x' . y' = x.y - ||x||^2/2 - ||y||^2/2 = -||x - y||^2 / 2``.
    """
    half_sq = -0.5 * points.pow(2).sum(-1, keepdim=True)  # (..., n, 1)
    ones = torch.ones_like(half_sq)
    extra = (half_sq, ones) if norm_first else (ones, half_sq)
    return torch.cat((points, *extra), dim=-1)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise Gaussian kernel ``exp(-||x_i - y_j||^2 / 2)``.

    The squared distance is expanded as ``||x||^2 + ||y||^2 - 2 x.y`` (not
    clamped at zero, as in the reference implementation). The two norm terms
    ride along as extra coordinates of a single matrix product, so the only
    (N, M) tensor made is the exponent, exponentiated in place when no
    gradient is needed.

    Args:
        x (Tensor): Shape (..., N, d).
        y (Tensor): Shape (..., M, d).

    Returns:
        Tensor: Shape (..., N, M).
    """
    exponent = torch.matmul(_lift(x, norm_first=False),
                            _lift(y, norm_first=True).transpose(-1, -2))  # (..., N, M)
    return exponent.exp() if exponent.requires_grad else exponent.exp_()
