"""Which implementation of an op runs, and the ops' registration with torch.

Each op's training implementation is an autograd Function whose forward and
backward call two registered operations, ``mmsoft::<op>_forward`` and
``mmsoft::<op>_backward``: Triton's kernels on CUDA tensors, PyTorch
elsewhere. Registered with ``torch.library.custom_op`` (torch >= 2.4), a
compiled model holds them as single nodes of its graph, and the ``meta``
device runs their shapes alone.
"""
import contextlib
import importlib
import importlib.metadata
from typing import Callable, Dict, Iterator, Optional

import torch

from ..utils.torch_compat import torch_version


# --- Tracing and mixed precision
if hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
    is_compiling = torch.compiler.is_compiling
else:  # torch < 2.3
    is_compiling = importlib.import_module('torch._dynamo').is_compiling


def records_forward_only() -> bool:
    """Whether ``torch.jit.trace`` or the ONNX exporter is recording."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def is_tracing() -> bool:
    """Whether a tracer or ``torch.compile`` is recording: the plain path runs."""
    return records_forward_only() or is_compiling()


# torch >= 2.4: the autocast queries take a device type.
_AUTOCAST_QUERY_TAKES_DEVICE = hasattr(torch, 'get_autocast_dtype')


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts to on ``device_type``; None when it is off."""
    if device_type == 'meta':
        return None

    if _AUTOCAST_QUERY_TAKES_DEVICE:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':  # torch < 2.4
        enabled = torch.is_autocast_cpu_enabled()
        return torch.get_autocast_cpu_dtype() if enabled else None
    if device_type == 'cuda' and torch.is_autocast_enabled():
        return torch.get_autocast_gpu_dtype()
    return None


def autocast_off(device_type: str):
    """Autocast switched off on ``device_type`` (``'meta'`` has none)."""
    if device_type == 'meta':
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """float16 and bfloat16 tensors as float32; others as they are."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def cast_floating(value, dtype: torch.dtype):
    """A float16, bfloat16 or float32 tensor in ``dtype``; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in (
            torch.float16, torch.bfloat16, torch.float32):
        return value.to(dtype)
    return value


def _device_type(values) -> str:
    return next((value.device.type for value in values
                 if isinstance(value, torch.Tensor)), 'cpu')


def apply_without_autocast(function: type, *args, cast_to: Optional[str] = 'float32'):
    """``function.apply(*args)`` with autocast off.

    Under autocast its floating inputs are cast first: to float32, or with
    ``cast_to='autocast'`` to autocast's dtype (None: left as they are).
    """
    device_type = _device_type(args)
    low = autocast_dtype(device_type)
    if low is None:
        return function.apply(*args)

    if cast_to is not None:
        dtype = torch.float32 if cast_to == 'float32' else low
        args = [cast_floating(arg, dtype) for arg in args]
    with autocast_off(device_type):
        return function.apply(*args)


def backward_without_autocast(backward: Callable) -> Callable:
    """Runs an autograd function's ``backward`` with autocast off."""

    def run(ctx, *grads):
        with autocast_off(_device_type(grads)):
            return backward(ctx, *grads)

    run.__doc__ = backward.__doc__
    return run


# --- Implementations and registration
#: torch >= 2.4 registers Python operations with ``torch.library.custom_op``.
HAS_CUSTOM_OPS = hasattr(torch.library, 'custom_op')

#: The kernels each registered operation launches on CUDA, by name (Triton's
#: and torch's; ``tests/test_ops_triton.py`` counts them under Triton's
#: interpreter). The kernel count of a training step counts each call so.
LAUNCHES: Dict[str, int] = {}


def triton_version() -> str:
    """The installed Triton's version, '' without one; read from its
    metadata (Triton itself is imported when a kernel runs)."""
    for name in ('triton', 'pytorch-triton'):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return ''


def triton_requirement() -> str:
    """What the kernels need, and what this environment has."""
    found = triton_version() or 'no Triton'
    return f'Triton 3.0 or later; this environment has {found}'


#: Whether CUDA tensors run the Triton kernels: they need Triton 3.0 or later
#: (torch >= 2.4 brings it). With an older Triton (torch 2.1 to 2.3) or
#: none, CUDA runs each op's PyTorch implementation, as the CPU does.
TRITON_KERNELS = torch_version(triton_version() or '0.0') >= (3, 0)  # none: 0.0
_TRITON_ON_CPU = False


@contextlib.contextmanager
def triton_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Runs the ops' Triton kernels on CPU tensors too (under Triton's
    interpreter, ``TRITON_INTERPRET=1``): how the CUDA path is tested
    without a GPU."""
    if enabled and not TRITON_KERNELS:
        raise RuntimeError(f'triton_on_cpu() (its interpreter) needs '
                           f'{triton_requirement()}.')
    global _TRITON_ON_CPU
    previous, _TRITON_ON_CPU = _TRITON_ON_CPU, enabled
    try:
        yield
    finally:
        _TRITON_ON_CPU = previous


def runs_triton(tensor: torch.Tensor) -> bool:
    """Whether the ops run Triton's kernels on ``tensor``'s device."""
    if tensor.device.type == 'cuda':
        return TRITON_KERNELS
    return _TRITON_ON_CPU and tensor.device.type == 'cpu'


def runs_reference(fused: bool, tensor: torch.Tensor) -> bool:
    """Whether an op runs its plain reference: where ``fused`` is off, where
    a tracer records (``torch.jit.trace``, ONNX), where torch has no custom
    ops to compile, and in inference on the CPU (one kernel evaluation, whole,
    is faster there than the training implementation's)."""
    if not fused or records_forward_only():
        return True
    if is_compiling():
        return not HAS_CUSTOM_OPS
    return (not torch.is_grad_enabled() and tensor.device.type == 'cpu'
            and not _TRITON_ON_CPU)


def strided_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` laid out with ``like``'s strides, as an operation's shape
    function (``torch.empty_like``) promises a compiled graph."""
    if value.stride() == like.stride():
        return value
    return torch.empty_like(like).copy_(value)


def register(name: str, launches: int, fake: Callable) -> Callable:
    """Registers the decorated function as ``mmsoft::<name>`` with its shapes'
    function ``fake``, where torch has custom ops; it launches ``launches``
    kernels on CUDA."""
    LAUNCHES[name] = launches

    def decorate(function: Callable) -> Callable:
        if not HAS_CUSTOM_OPS:
            return function
        op = torch.library.custom_op(f'mmsoft::{name}', function, mutates_args=())
        op.register_fake(fake)
        return op

    return decorate
