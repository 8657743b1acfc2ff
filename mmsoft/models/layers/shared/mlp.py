"""The two-layer feed-forward network of transformer blocks."""
from typing import Optional

import torch
import torch.nn as nn

from ...memory_efficient.recomputed_mlp import recomputed_mlp
from ...memory_efficient.switch import MemoryEfficient
from .gelu import GELU


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (as SOFT's reference blocks use)."""

    def __init__(self):
        super().__init__(approximate='tanh')


class MLP(MemoryEfficient, nn.Module):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    Memory-efficient path (:meth:`saves_memory` and dropout off, rate 0 or
    eval mode): backward
    recomputes the activation
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., C)."""
        dropout_active = self.training and self.drop.p > 0
        if self.saves_memory(x, self.fc1.weight) and not dropout_active:
            return recomputed_mlp(x, self.fc1, self.act, self.fc2.weight,
                                  self.fc2.bias, self.keep_hidden)
        hidden = self.drop(self.act(self.fc1(x)))  # (..., hidden)
        return self.drop(self.fc2(hidden))  # (..., C)
