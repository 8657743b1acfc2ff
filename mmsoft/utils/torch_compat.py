"""The torch APIs mmsoft uses that are newer than its oldest supported torch.

mmsoft is tested on torch 2.1 to 2.15 (``SUPPORTED_TORCH`` below: the two
ends the test suite runs on). Its requirements set no ceiling, so that
installing it never swaps a user's torch; on a torch outside the tested range,
``import mmsoft`` warns once (:func:`warn_if_untested_torch`). Every API that
appeared inside that range is detected here, once, and everything else in the
package calls these functions instead of the API itself:

=====================================  =======  ==================================
API                                    since    on older torch
=====================================  =======  ==================================
``torch.compiler.is_compiling``        2.3      ``torch._dynamo.is_compiling``
``torch.is_autocast_enabled(device)``  2.4      ``is_autocast_enabled()`` (CUDA),
                                                ``is_autocast_cpu_enabled()``
``torch.get_autocast_dtype(device)``   2.4      ``get_autocast_gpu_dtype()``,
                                                ``get_autocast_cpu_dtype()``
``torch.serialization.safe_globals``   2.5/2.6  a restricted unpickler
``torch.load`` ``weights_only=True``   2.6      (see :mod:`mmsoft.checkpoint.safe_load`)
by default, ``(obj, name)`` entries
``torch.onnx.export(dynamo=...)``      2.5      the TorchScript exporter is the
                                                only one and takes no argument
=====================================  =======  ==================================

One torch bug is detected here too, by running the operation once at import
(:data:`GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT`): torch 2.1's CPU kernel of
the exact GELU's backward reads a gradient laid out unlike GELU's input
(e.g. transposed) with the input's strides, and returns wrong values in
float32 and NaN in bfloat16.
"""
import importlib
import inspect
import warnings
from contextlib import nullcontext
from typing import ContextManager, Optional, Tuple

import torch
import torch.nn.functional as F

#: Oldest and newest torch (major, minor) that the test suite runs on.
SUPPORTED_TORCH = ((2, 1), (2, 15))


def torch_version(version: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of ``version`` (default: the installed torch).

    Args:
        version (str, optional): A version string such as ``'2.1.2+cu121'``.

    Returns:
        tuple[int, int]: e.g. ``(2, 1)``.
    """
    major, minor = (version or torch.__version__).split('+')[0].split('.')[:2]
    return int(major), int(''.join(ch for ch in minor if ch.isdigit()) or 0)


TORCH_VERSION = torch_version()


class UntestedTorchWarning(UserWarning):
    """The installed torch lies outside the range mmsoft is tested on."""


def warn_if_untested_torch(version: Optional[str] = None) -> bool:
    """Warns when ``version`` (default: the installed torch) lies outside
    :data:`SUPPORTED_TORCH`.

    Args:
        version (str, optional): A torch version string.

    Returns:
        bool: Whether it warned.
    """
    floor, ceiling = SUPPORTED_TORCH
    found = torch_version(version)
    if floor <= found <= ceiling:
        return False
    warnings.warn(
        f'mmsoft is tested on torch {floor[0]}.{floor[1]} to '
        f'{ceiling[0]}.{ceiling[1]}; the installed torch is '
        f'{version or torch.__version__}. It may work; if something fails, '
        'a torch in the tested range is the first thing to try.',
        UntestedTorchWarning, stacklevel=2)
    return True


# Resolved once here: dynamo traces a call of the function, not an import.
if hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
    _is_compiling = torch.compiler.is_compiling
else:  # torch < 2.3
    _is_compiling = importlib.import_module('torch._dynamo').is_compiling


def is_compiling() -> bool:
    """Whether ``torch.compile`` (dynamo) is tracing the caller."""
    return _is_compiling()


def _autocast_query_takes_device() -> bool:
    """Whether ``torch.is_autocast_enabled`` takes a device type (2.4)."""
    try:
        torch.is_autocast_enabled('cpu')
    except TypeError:
        return False
    return True


# Decided once: the query runs in every memory-saving layer's forward.
_AUTOCAST_QUERY_TAKES_DEVICE = _autocast_query_takes_device()


def autocast_enabled(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` (``'cpu'``,
    ``'cuda'``, ...); never for ``'meta'`` (shapes only), which has none."""
    if _AUTOCAST_QUERY_TAKES_DEVICE:
        return device_type != 'meta' and torch.is_autocast_enabled(device_type)
    if device_type == 'cpu':  # torch < 2.4
        return torch.is_autocast_cpu_enabled()
    if device_type == 'cuda':
        return torch.is_autocast_enabled()
    return False


def autocast_off(device_type: str) -> ContextManager:
    """``torch.autocast(device_type, enabled=False)``; a no-op on ``'meta'``
    (shapes only), where ``torch.autocast`` raises."""
    if device_type == 'meta':
        return nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype ``torch.autocast`` casts to on ``device_type``, None when off.

    Args:
        device_type (str): ``'cpu'``, ``'cuda'``, ...

    Returns:
        torch.dtype | None: ``torch.float16`` or ``torch.bfloat16``.
    """
    if not autocast_enabled(device_type):
        return None
    if hasattr(torch, 'get_autocast_dtype'):
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':  # torch < 2.4
        return torch.get_autocast_cpu_dtype()
    return torch.get_autocast_gpu_dtype()


def has_native_weights_only_globals() -> bool:
    """Whether ``torch.load(weights_only=True)`` is the default and accepts
    every allow-list entry mmsoft registers (``(obj, 'module.name')`` pairs
    and ``torch.serialization.safe_globals``): torch >= 2.6."""
    return (TORCH_VERSION >= (2, 6)
            and hasattr(torch.serialization, 'add_safe_globals')
            and hasattr(torch.serialization, 'safe_globals'))


def onnx_export_takes_dynamo() -> bool:
    """Whether ``torch.onnx.export`` has the ``dynamo`` argument (torch >=
    2.5; before, its TorchScript exporter is the only one)."""
    return 'dynamo' in inspect.signature(torch.onnx.export).parameters


def _gelu_backward_ignores_gradient_strides() -> bool:
    """Whether the exact GELU's backward on the CPU gives a transposed
    gradient a different result than the same gradient made contiguous."""
    # Autograd on, also where mmsoft is imported under no_grad or
    # inference_mode.
    with torch.inference_mode(False), torch.enable_grad():
        inputs = torch.linspace(-3, 3, 2 * 8 * 16).view(2, 8, 16).requires_grad_()
        gradient = torch.linspace(1, 2, 2 * 16 * 8).view(2, 16, 8).transpose(1, 2)
        (strided,) = torch.autograd.grad(F.gelu(inputs), inputs, gradient)
        (contiguous,) = torch.autograd.grad(F.gelu(inputs), inputs,
                                            gradient.contiguous())
    return not torch.allclose(strided, contiguous)


#: Whether mmsoft's GELU (:func:`mmsoft.models.functional.gelu`) hands its
#: backward a contiguous gradient: True where torch's kernel gets a strided
#: one wrong (torch 2.1 on x86 CPUs).
GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT = _gelu_backward_ignores_gradient_strides()
