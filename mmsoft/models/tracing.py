"""Whether a tracer or exporter records the model: the one place that asks.

Three tracers run mmsoft's models: ``torch.jit.trace`` (mmengine's FLOP
counter, TorchScript-based ONNX export), the ONNX exporter itself and
``torch.compile``. None of them can follow data-dependent Python control
flow, and none of them records what happens inside a
``torch.autograd.Function``'s backward. Every layer that would take another
path for them asks :func:`is_tracing`, and nothing else in the package
queries torch's tracer states:

* the memory-efficient training path (:mod:`mmsoft.models.memory_efficient`)
  is off, with one exception: SOFT's Newton iteration stays one autograd
  function, which the FLOP counter counts by formula
  (:mod:`~mmsoft.models.ops.kernel_inverse`);
* SOFT++'s Newton scale runs all its halving rounds instead of stopping
  early (:mod:`~mmsoft.models.ops.kernel_inverse`);
* the chunked kernel product of inference concatenates its chunks instead
  of writing them into one output
  (:mod:`~mmsoft.models.memory_efficient.kernel_attention`);
* the contiguous-gradient identity (torch 2.1's GELU; the compiler's
  stride model of LayerNorm's backward) is left out of the forward-only
  tracers' records (:func:`records_forward_only`,
  :mod:`~mmsoft.models.ops.contiguous_gradient`).

What ONNX needs beyond that (the Newton iteration for the closed form's
eigendecomposition, the kernel product unchunked, sizes that follow a traced
input) is the deployment code's:
:func:`mmsoft.deployment.onnx_export.export_formulation` switches the layers
to it while it exports, so FLOP counting traces what eager execution runs.
"""
import torch

from ..utils.torch_compat import is_compiling


def records_forward_only() -> bool:
    """Whether ``torch.jit.trace`` or the ONNX exporter is recording the
    caller: tracers of the forward pass alone (``torch.compile`` traces the
    backward too)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def is_tracing() -> bool:
    """Whether ``torch.jit.trace``, the ONNX exporter or ``torch.compile``
    is recording the caller."""
    return records_forward_only() or is_compiling()
