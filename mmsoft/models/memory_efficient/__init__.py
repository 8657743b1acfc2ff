"""The memory-efficient training path of every layer, behind one switch.

Each layer's ``forward`` reads as its plain PyTorch math and picks, in one
line, the implementation below with the same signature when
:func:`takes_memory_efficient_path` says so (the switch on, the default,
and autograd recording): the same outputs and gradients, less kept for
backward. ``memory_efficient=False`` on a backbone (or
:func:`set_memory_efficient` on any module) turns every layer to plain
autograd; tracers always see the plain operations (:mod:`..tracing`).

* :mod:`.switch`: :class:`MemoryEfficient`, the layers' mixin with the
  ``memory_efficient`` attribute, :func:`takes_memory_efficient_path`, the
  one decision every layer asks, and :func:`set_memory_efficient`.
* :mod:`.recomputed_mlp`: the MLP keeps its input and fc1's output (or only
  the input, with ``recompute_mlp``); backward recomputes the activation.
* :mod:`.norm_act_conv`: a stem's ``BatchNorm -> activation -> conv`` keeps
  BatchNorm's input only; running statistics are updated once.
* :mod:`.recompute`: UFO attention and the local patch interaction keep
  their inputs and recompute the rest in backward.
* :mod:`.kernel_attention`: SOFT attention keeps neither Gaussian kernel
  (``A`` recomputed, ``K1`` recomputed chunk by chunk) nor the symmetric
  scaling's intermediate.
* :mod:`.newton_backward`: the Newton iteration keeps its operand alone;
  backward recomputes the iterates.
"""
from .switch import (MemoryEfficient, set_memory_efficient,
                     takes_memory_efficient_path)

__all__ = ['MemoryEfficient', 'set_memory_efficient', 'takes_memory_efficient_path']
