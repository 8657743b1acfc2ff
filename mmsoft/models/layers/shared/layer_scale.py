"""A per-channel output scale folded into a Linear's or convolution's weights."""
from typing import Optional, Tuple

import torch
import torch.nn as nn


def scaled_weight_and_bias(layer: nn.Module, scale: Optional[torch.Tensor]
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The weight and bias that compute ``scale * layer(x)`` as one layer.

    ``W' = scale W`` and ``b' = scale b``, row by output channel. Autograd
    keeps only the parameters for the product, not the layer's output, and
    ``scale``'s gradient follows by the chain rule
    (``dscale_c = <W_c, dW'_c> + b_c db'_c``).

    Args:
        layer (nn.Module): A Linear or convolution; weight (C_out, ...),
            bias (C_out, ) or None.
        scale (Tensor, optional): Per-output-channel scale, shape (C_out, ).
            None returns the layer's own parameters.

    Returns:
        tuple[Tensor, Tensor | None]: Weight (C_out, ...) and bias (C_out, ).
    """
    weight, bias = layer.weight, layer.bias
    if scale is None:
        return weight, bias
    weight = weight * scale.view(-1, *(1, ) * (weight.dim() - 1))  # (C_out, ...)
    return weight, None if bias is None else bias * scale
