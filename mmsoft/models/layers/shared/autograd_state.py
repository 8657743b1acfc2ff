"""Whether autograd is recording, for layers that save memory in training."""
import torch


def records_gradient(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensors``.

    False while tracing (ONNX export, FLOP counting): tracers record the
    plain operations, not the memory-saving autograd functions.
    """
    tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
    return (torch.is_grad_enabled() and not tracing
            and any(t.requires_grad for t in tensors))
