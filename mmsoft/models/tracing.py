"""How tracers and exporters see the models: the one place that decides.

Three tracers run mmsoft's models: ``torch.jit.trace`` (mmengine's FLOP
counter, TorchScript-based ONNX export), the ONNX exporter itself and
``torch.compile``. Every layer that takes another path for them asks
:func:`is_tracing` or :func:`records_forward_only`, and nothing else in the
package queries torch's tracer states:

* a layer's memory-efficient implementation
  (:func:`~mmsoft.models.memory_efficient.switch.takes_memory_efficient_path`)
  is replaced by its plain operations, which tracers record op by op;
* the contiguous-gradient identity is left out of the forward-only tracers'
  records (:func:`records_forward_only`,
  :mod:`~mmsoft.models.ops.contiguous_gradient`).

What ONNX needs beyond that is the export formulation of the
:class:`Exportable` modules, which :func:`set_exportable` switches on:
SOFT's kernel inverse by the Newton iteration instead of the closed form's
eigendecomposition, and the bottleneck cap and position-embedding resize on
sizes that follow a traced input.
:func:`mmsoft.deployment.onnx_export.export_formulation` turns it on while
it exports.
"""
import torch
import torch.nn as nn

from ..utils.torch_compat import is_compiling
from .module_switch import switch_modules


def records_forward_only() -> bool:
    """Whether ``torch.jit.trace`` or the ONNX exporter is recording the
    caller: tracers of the forward pass alone (``torch.compile`` traces the
    backward too)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def is_tracing() -> bool:
    """Whether ``torch.jit.trace``, the ONNX exporter or ``torch.compile``
    is recording the caller."""
    return records_forward_only() or is_compiling()


class Exportable:
    """Mixin of the modules with an ONNX formulation of their forward.

    ``exportable`` (False unless :func:`set_exportable` turns it on) selects
    it: the same function in operators ONNX has, with sizes that follow a
    traced input.
    """

    exportable: bool = False


def set_exportable(model: nn.Module, enabled: bool) -> nn.Module:
    """Turns the export formulation of every module of ``model`` on or off.

    Args:
        model (nn.Module): Any module; its :class:`Exportable` modules
            (``model`` included) are switched.
        enabled (bool): True: the export formulation; False: the eager one
            (the default of every module).

    Returns:
        nn.Module: ``model``.

    Raises:
        ValueError: If ``enabled`` is not a bool.
    """
    return switch_modules(model, Exportable, 'exportable', enabled, 'enabled')
