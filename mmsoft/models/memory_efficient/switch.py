"""The switch between the memory-efficient and the plain training path."""
import torch
import torch.nn as nn

from ..module_switch import switch_modules
from ..tracing import is_tracing


class MemoryEfficient:
    """Mixin of the layers that have a memory-efficient path.

    ``memory_efficient`` (True unless :func:`set_memory_efficient` turns it
    off) selects the implementation in :mod:`mmsoft.models.memory_efficient`
    instead of the plain PyTorch of the layer's forward, while
    :func:`takes_memory_efficient_path` allows it. Both give the same outputs
    and gradients.
    """

    memory_efficient: bool = True
    #: Whether the memory-efficient implementation also holds less without
    #: autograd (SOFT attention's query-bottleneck kernel, one chunk at a
    #: time); False: inference runs the plain operations.
    saves_memory_in_inference: bool = False


def takes_memory_efficient_path(module: nn.Module) -> bool:
    """Whether ``module`` runs its memory-efficient implementation now.

    True when the module's switch (``module.memory_efficient``) is on, no
    tracer records (:func:`~mmsoft.models.tracing.is_tracing`:
    ``torch.jit.trace``, the ONNX exporter and ``torch.compile`` see the plain
    operations), and autograd records or the implementation saves memory in
    inference too (:attr:`MemoryEfficient.saves_memory_in_inference`).

    Args:
        module (nn.Module): A layer with the :class:`MemoryEfficient` mixin.

    Returns:
        bool: Whether to call the memory-efficient function.
    """
    return (module.memory_efficient and not is_tracing()
            and (torch.is_grad_enabled() or module.saves_memory_in_inference))


def set_memory_efficient(model: nn.Module, enabled: bool) -> nn.Module:
    """Turns the memory-efficient path of every layer of ``model`` on or off.

    Args:
        model (nn.Module): Any module; its :class:`MemoryEfficient` layers
            (``model`` included) are switched.
        enabled (bool): True: the memory-efficient path (the default of
            every layer); False: plain autograd.

    Returns:
        nn.Module: ``model``.

    Raises:
        ValueError: If ``enabled`` is not a bool.
    """
    return switch_modules(model, MemoryEfficient, 'memory_efficient', enabled)
