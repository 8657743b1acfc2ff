"""The two-layer feed-forward network of transformer blocks."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...memory_efficient.recomputed_mlp import recomputed_mlp
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from .gelu import GELU
from .layer_scale import scaled_weight_and_bias


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (as SOFT's reference blocks use)."""

    def __init__(self):
        super().__init__(approximate='tanh')


class MLP(MemoryEfficient, nn.Module):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    Memory-efficient path (:func:`takes_memory_efficient_path`, and the
    dropout inactive: rate 0 or eval mode, since the recomputing function
    has no dropout): backward recomputes the activation
    (:mod:`mmsoft.models.memory_efficient.recomputed_mlp`), so the
    activation's output, a hidden-width tensor, is not kept for backward.

    Args:
        in_dims (int): Input and output width.
        hidden_dims (int): Hidden width.
        act_layer (type): Activation class. Default: :class:`.gelu.GELU`.
        drop (float): Dropout after the activation and the output. Default: 0.
        keep_hidden (bool): On the memory-efficient path, keep ``fc1``'s
            output for backward (True) or recompute it from the input as
            well (False: a hidden-width tensor less for one more ``fc1``
            matmul). Default: True.
    """

    def __init__(self, in_dims: int, hidden_dims: int,
                 act_layer: type = GELU, drop: Optional[float] = 0.,
                 keep_hidden: bool = True):
        super().__init__()
        self.keep_hidden = keep_hidden
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor,
                layer_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``layer_scale * fc2(drop(act(fc1(x))))``, then dropout.

        Args:
            x (Tensor): Tokens, shape (..., C).
            layer_scale (Tensor, optional): Per-channel output scale, shape
                (C, ), folded into ``fc2``'s weight and bias. Default: None.

        Returns:
            Tensor: Shape (..., C).
        """
        weight2, bias2 = scaled_weight_and_bias(self.fc2, layer_scale)
        dropout_active = self.training and self.drop.p > 0
        if takes_memory_efficient_path(self) and not dropout_active:
            return recomputed_mlp(x, self.fc1, self.act, weight2, bias2,
                                  self.keep_hidden)
        hidden = self.drop(self.act(self.fc1(x)))  # (..., hidden)
        return self.drop(F.linear(hidden, weight2, bias2))  # (..., C)
