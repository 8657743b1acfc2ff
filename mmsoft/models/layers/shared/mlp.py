"""The two-layer feed-forward network of transformer blocks."""
from typing import Optional

import torch
import torch.nn as nn


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (as SOFT's reference blocks use)."""

    def __init__(self):
        super().__init__(approximate='tanh')


class MLP(nn.Module):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    Args:
        in_dims (int): Input and output width.
        hidden_dims (int): Hidden width.
        act_layer (type): Activation class. Default: ``nn.GELU``.
        drop (float): Dropout after the activation and the output. Default: 0.
    """

    def __init__(self, in_dims: int, hidden_dims: int,
                 act_layer: type = nn.GELU, drop: Optional[float] = 0.):
        super().__init__()
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., C)."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
