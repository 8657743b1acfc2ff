"""The two-layer feed-forward network of transformer blocks."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .autograd_state import records_gradient
from .layer_scale import scaled_parameters
from .recomputed_mlp import recomputed_mlp


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (as SOFT's reference blocks use)."""

    def __init__(self):
        super().__init__(approximate='tanh')


class MLP(nn.Module):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    When gradients are recorded and dropout is off (rate 0 or eval mode),
    backward recomputes the activation (see :mod:`.recomputed_mlp`): same
    outputs and gradients, without the activation's output, a hidden-width
    tensor, kept for backward. Otherwise (inference, ONNX
    export, active dropout) the layers run one after the other.

    Args:
        in_dims (int): Input and output width.
        hidden_dims (int): Hidden width.
        act_layer (type): Activation class. Default: ``nn.GELU``.
        drop (float): Dropout after the activation and the output. Default: 0.
        keep_hidden (bool): Keep ``fc1``'s output for backward (True) or
            recompute it from the input as well (False: a hidden-width
            tensor less for one more ``fc1`` matmul). Default: True.
    """

    def __init__(self, in_dims: int, hidden_dims: int,
                 act_layer: type = nn.GELU, drop: Optional[float] = 0.,
                 keep_hidden: bool = True):
        super().__init__()
        self.keep_hidden = keep_hidden
        self.fc1 = nn.Linear(in_dims, hidden_dims)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dims, in_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor,
                out_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(..., C) -> (..., C).

        ``out_scale`` (C, ): a LayerScale, folded into ``fc2`` (see
        :mod:`.layer_scale`). Default: None.
        """
        weight2, bias2 = scaled_parameters(self.fc2, out_scale)
        if self._recompute_hidden(x):
            return recomputed_mlp(x, self.fc1, self.act, weight2, bias2,
                                  self.keep_hidden)
        hidden = self.drop(self.act(self.fc1(x)))
        return self.drop(F.linear(hidden, weight2, bias2))

    def _recompute_hidden(self, x: torch.Tensor) -> bool:
        """Whether backward should recompute the hidden layer."""
        dropout_active = self.training and self.drop.p > 0
        return records_gradient(x, self.fc1.weight) and not dropout_active
