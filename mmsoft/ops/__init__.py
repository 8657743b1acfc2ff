"""The operations the models' blocks call.

Each has a plain reference (PyTorch and autograd: what tests compare with
and ONNX exports) and one training implementation, an autograd Function
whose backward is written out and keeps less for backward; on CUDA it runs
Triton's kernels (:mod:`mmsoft.ops.triton`). docs/layout.md says which runs
in training, in inference and in export.
"""
from ._library import LAUNCHES, triton_on_cpu
from .layer_norm import layer_norm_linear, layer_norm_mlp, scaled_linear
from .soft import soft_attention
from .xnorm import xnorm_attention

__all__ = ['LAUNCHES', 'layer_norm_linear', 'layer_norm_mlp', 'scaled_linear',
           'soft_attention', 'triton_on_cpu', 'xnorm_attention']
