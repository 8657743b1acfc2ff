"""The switch between the memory-efficient and the plain training path."""
import torch
import torch.nn as nn

from ..tracing import is_tracing


def records_gradient(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensors``, outside tracing.

    False while a tracer records (:func:`~mmsoft.models.tracing.is_tracing`):
    tracers record the plain operations.
    """
    return (torch.is_grad_enabled() and not is_tracing()
            and any(t.requires_grad for t in tensors))


class MemoryEfficient:
    """Mixin of the layers that have a memory-efficient path.

    ``memory_efficient`` (True unless :func:`set_memory_efficient` turns it
    off) selects, while autograd records, the implementation in
    :mod:`mmsoft.models.memory_efficient` instead of the plain PyTorch the
    layer's ``forward`` reads as. Both give the same outputs and gradients.
    """

    memory_efficient: bool = True

    def saves_memory(self, *tensors: torch.Tensor) -> bool:
        """Whether this call takes the memory-efficient path: the switch is
        on and autograd records an operation on ``tensors``."""
        return self.memory_efficient and records_gradient(*tensors)


def set_memory_efficient(model: nn.Module, enabled: bool) -> nn.Module:
    """Turns the memory-efficient path of every layer of ``model`` on or off.

    Args:
        model (nn.Module): Any module; its :class:`MemoryEfficient` layers
            (``model`` included) are switched.
        enabled (bool): True: the memory-efficient path (the default of
            every layer); False: plain autograd.

    Returns:
        nn.Module: ``model``.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f'memory_efficient={enabled!r} is invalid; expected True '
                         f'or False.')
    for module in model.modules():
        if isinstance(module, MemoryEfficient):
            module.memory_efficient = enabled
    return model
