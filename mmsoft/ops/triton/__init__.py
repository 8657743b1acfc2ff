"""The CUDA implementations of :mod:`mmsoft.ops`, as Triton kernels.

Each module holds the kernels of one op and the host functions that launch
them on the tensors' device; :data:`LAUNCHES` of each module says how many
kernels (Triton's and torch's) each host function launches. Importing this
package imports Triton: the ops import it only when a Triton path runs.
"""
import torch


def dot_precision(dtype: torch.dtype, float32_accurate: bool) -> str:
    """``tl.dot``'s ``input_precision`` for ``dtype``: ``'ieee'`` where a product
    must be float32-accurate or torch's float32 matmuls are, else ``'tf32'``."""
    if dtype != torch.float32 or float32_accurate \
            or torch.get_float32_matmul_precision() == 'highest':
        return 'ieee'
    return 'tf32'
