"""LayerScale folded into the layer before it.

``gamma * layer(x)`` (per-channel LayerScale, as in UFO-ViT's blocks) makes
autograd keep ``layer(x)``, a token-width tensor, for gamma's gradient. When
the layer is linear in its parameters (a Linear or a convolution), the same
output is ``layer'(x)`` with the layer's weight and bias scaled per output
channel, ``W' = gamma W`` and ``b' = gamma b``: autograd then keeps only the
parameters for the scaling and x for the layer, which the layer keeps
anyway, and gamma's gradient comes out of the chain rule exactly
(``dgamma_c = <W_c, dW'_c> + b_c db'_c``).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn


def scaled_parameters(layer: nn.Module, scale: Optional[torch.Tensor]
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The weight and bias of ``scale * layer(x)`` as one layer.

    Args:
        layer (nn.Module): A Linear or convolution, weight (C_out, ...).
        scale (Tensor, optional): Per-output-channel scale, shape (C_out, );
            None returns the layer's own parameters.

    Returns:
        tuple[Tensor, Tensor | None]: Weight (C_out, ...) and bias (C_out, ).
    """
    weight, bias = layer.weight, layer.bias
    if scale is None:
        return weight, bias
    weight = weight * scale.view(-1, *(1, ) * (weight.dim() - 1))
    return weight, None if bias is None else bias * scale
