"""LayerNorm that keeps its output, not its input, for backward."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...memory_efficient.layer_norm import layer_norm_from_output, rebuilds_input
from ...memory_efficient.switch import MemoryEfficient


class LayerNormSavingOutput(MemoryEfficient, nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` whose memory-efficient path keeps its
    output, not its input, for backward
    (:mod:`mmsoft.models.memory_efficient.layer_norm`).

    Same parameters, state-dict keys and outputs as ``nn.LayerNorm``. The
    memory-efficient path runs when :meth:`saves_memory` (the switch is on
    and autograd records), the norm is over the last dimension and
    :func:`~mmsoft.models.memory_efficient.layer_norm.rebuilds_input` (no
    near-zero gamma, parameters in the dtype the norm computes in: float32
    under autocast); otherwise ``F.layer_norm`` does.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., C)."""
        params = [p for p in (self.weight, self.bias) if p is not None]
        if (len(self.normalized_shape) == 1 and self.saves_memory(x, *params)
                and rebuilds_input(x, self.weight, self.bias)):
            return layer_norm_from_output(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
