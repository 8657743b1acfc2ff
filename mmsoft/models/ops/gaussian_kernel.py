"""The Gaussian kernel of SOFT attention."""
import torch

from .float32_matmul import float32_matmul


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor,
                    float32_products: bool = False) -> torch.Tensor:
    """Pairwise Gaussian kernel ``exp(-||x_i - y_j||^2 / 2)``.

    The exponent is expanded as ``x.y - ||x||^2 / 2 - ||y||^2 / 2`` (not
    clamped, as in the reference implementation). Only ``x.y`` goes through
    a matrix product; the norm terms are added element-wise, so their
    precision does not depend on the matmul precision setting (TF32). The
    only (N, M) tensor made is the exponent, updated in place.

    Args:
        x (Tensor): Shape (..., N, d).
        y (Tensor): Shape (..., M, d).
        float32_products (bool): Compute ``x.y`` at float32 accuracy under
            TF32 matmuls too
            (:func:`~mmsoft.models.ops.float32_matmul.float32_matmul`,
            three products instead of one). Default: False.

    Returns:
        Tensor: Shape (..., N, M).
    """
    y_t = y.transpose(-1, -2)  # (..., d, M)
    exponent = (float32_matmul(x, y_t) if float32_products
                else torch.matmul(x, y_t))  # (..., N, M)
    half_sq_x = 0.5 * x.pow(2).sum(-1, keepdim=True)  # (..., N, 1)
    half_sq_y = 0.5 * y.pow(2).sum(-1).unsqueeze(-2)  # (..., 1, M)
    exponent = exponent.sub_(half_sq_x).sub_(half_sq_y)
    return exponent.exp() if exponent.requires_grad else exponent.exp_()


def bottleneck_kernel(bottleneck: torch.Tensor) -> torch.Tensor:
    """``A = k(L, L)``, the m x m kernel the inverse is taken of, at float32
    accuracy whatever the matmul precision.

    Args:
        bottleneck (Tensor): L, shape (..., m, d).

    Returns:
        Tensor: Shape (..., m, m).
    """
    return gaussian_kernel(bottleneck, bottleneck, float32_products=True)
