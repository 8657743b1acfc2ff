"""LayerScale folded into the layer before it.

``gamma * layer(x)`` (per-channel LayerScale, as in UFO-ViT's blocks) makes
autograd keep ``layer(x)``, a token-width tensor, for gamma's gradient. When
the layer is linear in its parameters (a Linear or a convolution), the same
output is ``layer'(x)`` with the layer's weight and bias scaled per output
channel, ``W' = gamma W`` and ``b' = gamma b``: autograd then keeps only the
parameters for the scaling and x for the layer, which the layer keeps
anyway, and gamma's gradient comes out of the chain rule exactly
(``dgamma_c = <W_c, dW'_c> + b_c db'_c``).

:func:`scaled_call` runs a whole branch that way: the branch module (UFO
attention, the local patch interaction, the FFN) runs its own ``forward``,
memory-efficient path included, with the parameters of its last layer
replaced by the scaled ones (``torch.func.functional_call``).
:func:`ufo_block_with_folded_scales` is a UFO-ViT block made of such
branches.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch.func import functional_call

from ..ops.valid_region import ValidShapes


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


def scaled_call(branch: nn.Module, last_layer: str, scale: torch.Tensor, *args):
    """``scale * branch(*args)``, ``scale`` folded into ``branch``'s last layer.

    Args:
        branch (nn.Module): A module whose output is that of its Linear or
            convolution ``last_layer`` (its dropout aside).
        last_layer (str): That layer's name in ``branch``, e.g. ``'fc2'``.
        scale (Tensor): Per-channel scale, shape (C_out, ).
        *args: The arguments of ``branch``.

    Returns:
        What ``branch(*args)`` returns, scaled per channel.
    """
    weight, bias = scaled_parameters(branch.get_submodule(last_layer), scale)
    scaled: Dict[str, torch.Tensor] = {f'{last_layer}.weight': weight}
    if bias is not None:
        scaled[f'{last_layer}.bias'] = bias
    return functional_call(branch, scaled, args)


def ufo_block_with_folded_scales(block: nn.Module, x: torch.Tensor,
                                 hw_shape: Tuple[int, int],
                                 valid_shapes: Optional[ValidShapes] = None,
                                 key_mask: Optional[torch.Tensor] = None
                                 ) -> torch.Tensor:
    """A :class:`UFOBlock`'s forward, each LayerScale folded into its
    branch's last layer (the attention's ``proj``, the local patch
    interaction's ``conv2``, the FFN's ``fc2``), so that no branch output is
    kept for the scale's gradient.

    Args:
        block (UFOBlock): The block.
        x (Tensor): Tokens, shape (B, N, C), on an ``hw_shape`` grid.
        hw_shape (tuple[int, int]): The grid (H, W).
        valid_shapes (list[tuple[int, int]], optional): As in the block.
        key_mask (Tensor, optional): (B, N) bool, the valid tokens.

    Returns:
        Tensor: Shape (B, N, C).
    """
    drop_path = block.drop_path
    x = x + drop_path(scaled_call(block.attn, 'proj', block.gamma1, block.norm1(x),
                                  key_mask))
    x = x + drop_path(scaled_call(block.lpi, 'conv2', block.gamma2, block.norm2(x),
                                  hw_shape, valid_shapes))
    return x + drop_path(scaled_call(block.ffn, 'fc2', block.gamma3, block.norm3(x)))
