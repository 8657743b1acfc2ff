"""The torch APIs newer than mmsoft's oldest tested torch, detected once.

mmsoft is tested on torch 2.1 to 2.15 and sets no ceiling; ``import mmsoft``
warns once on a torch outside that range. Older torches lack
``torch.compiler.is_compiling`` (2.3) and the device argument of the
autocast queries (2.4). Torch 2.1's CPU kernel of the exact GELU's backward
reads a gradient laid out unlike its input with the input's strides: it is
detected here by running it once.
"""
import importlib
import warnings
from contextlib import nullcontext
from typing import ContextManager, Optional, Tuple

import torch
import torch.nn.functional as F

#: Oldest and newest torch (major, minor) that the test suite runs on.
SUPPORTED_TORCH = ((2, 1), (2, 15))


def torch_version(version: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of ``version``, e.g. ``'2.1.2+cu121'``, or of the torch."""
    major, minor = (version or torch.__version__).split('+')[0].split('.')[:2]
    return int(major), int(''.join(ch for ch in minor if ch.isdigit()) or 0)


TORCH_VERSION = torch_version()


class UntestedTorchWarning(UserWarning):
    """The installed torch lies outside the range mmsoft is tested on."""


def warn_if_untested_torch(version: Optional[str] = None) -> bool:
    """Warns, and returns True, when ``version`` (default: the installed
    torch) lies outside :data:`SUPPORTED_TORCH`."""
    floor, ceiling = SUPPORTED_TORCH
    if floor <= torch_version(version) <= ceiling:
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
    is_compiling = torch.compiler.is_compiling
else:  # torch < 2.3
    is_compiling = importlib.import_module('torch._dynamo').is_compiling


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype ``torch.autocast`` casts to on ``device_type``; None when
    autocast is off there, and on ``'meta'``."""
    if device_type == 'meta':
        return None
    if TORCH_VERSION >= (2, 4):
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    if device_type == 'cpu':
        enabled = torch.is_autocast_cpu_enabled()
        return torch.get_autocast_cpu_dtype() if enabled else None
    if device_type == 'cuda' and torch.is_autocast_enabled():
        return torch.get_autocast_gpu_dtype()
    return None


def autocast_off(device_type: str) -> ContextManager:
    """``torch.autocast(device_type, enabled=False)``; nothing on ``'meta'``."""
    if device_type == 'meta':
        return nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def _gelu_backward_ignores_gradient_strides() -> bool:
    """Whether the GELU backward on the CPU gives a transposed gradient another
    result than the same gradient made contiguous."""
    with torch.inference_mode(False), torch.enable_grad():
        inputs = torch.linspace(-3, 3, 2 * 8 * 16).view(2, 8, 16).requires_grad_()
        gradient = torch.linspace(1, 2, 2 * 16 * 8).view(2, 16, 8).transpose(1, 2)
        (strided,) = torch.autograd.grad(F.gelu(inputs), inputs, gradient)
        (contiguous,) = torch.autograd.grad(F.gelu(inputs), inputs,
                                            gradient.contiguous())
    return not torch.allclose(strided, contiguous)


#: Whether mmsoft's GELU hands its backward a contiguous gradient: True where
#: torch's kernel gets a strided one wrong (torch 2.1 on x86 CPUs).
GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT = _gelu_backward_ignores_gradient_strides()
