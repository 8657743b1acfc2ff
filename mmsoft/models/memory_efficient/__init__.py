"""The memory-efficient training path of every layer, behind one switch.

Each layer's ``forward`` reads as its plain PyTorch math. While autograd
records, a layer whose switch is on (the default) runs instead the
implementation below: the same outputs and gradients, less kept for
backward. ``memory_efficient=False`` on a backbone (or
:func:`set_memory_efficient` on any module) turns every layer to plain
autograd; tracers always see the plain operations (:mod:`..tracing`).

* :mod:`.switch`: :class:`MemoryEfficient`, the layers' mixin with the
  ``memory_efficient`` attribute, and :func:`set_memory_efficient`.
* :mod:`.recomputed_mlp`: the FFN keeps its input and fc1's output (or only
  the input, with ``recompute_ffn``); backward recomputes the activation.
* :mod:`.norm_act_conv`: a stem's ``BatchNorm -> activation -> conv`` keeps
  BatchNorm's input only; running statistics are updated once.
* :mod:`.recompute`: UFO attention and the local patch interaction keep
  their inputs and recompute the rest in backward.
* :mod:`.layer_scale`: UFO-ViT's ``gamma * branch(x)`` folded into the
  branch's last layer, so the branch output is not kept for gamma.
* :mod:`.kernel_attention`: SOFT attention keeps neither Gaussian kernel
  (``A`` recomputed, ``K1`` recomputed chunk by chunk) nor the symmetric
  scaling's intermediate.
* :mod:`.newton_backward`: the Newton iteration keeps its operand alone;
  backward recomputes the iterates.
"""
from .switch import MemoryEfficient, records_gradient, set_memory_efficient

__all__ = ['MemoryEfficient', 'records_gradient', 'set_memory_efficient']
