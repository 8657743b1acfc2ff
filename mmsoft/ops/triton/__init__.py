"""The CUDA implementations of :mod:`mmsoft.ops`, as Triton kernels.

Each module holds the kernels of one op and the host functions that launch
them on the tensors' device; each module's ``LAUNCHES`` says how many kernels
(Triton's and torch's) each host function launches. Importing this package
imports Triton: the ops import it only when a Triton path runs. The kernels
need Triton 3.0 or later (``TRITON_KERNELS``).
"""
import torch

from .._library import TRITON_KERNELS, triton_requirement

if not TRITON_KERNELS:
    raise ImportError(f"mmsoft's Triton kernels need {triton_requirement()}.",
                      name='triton')


def dot_precision(dtype: torch.dtype, float32_accurate: bool) -> str:
    """``tl.dot``'s ``input_precision`` for ``dtype``, as torch's own products
    round: exact (``'ieee'``) where torch's float32 matmuls are; where torch
    allows TF32, TF32 (``'tf32'``), or three TF32 passes (``'tf32x3'``, as the
    references' float32-accurate products) where ``float32_accurate``."""
    if dtype != torch.float32 or torch.get_float32_matmul_precision() == 'highest':
        return 'ieee'
    return 'tf32x3' if float32_accurate else 'tf32'
