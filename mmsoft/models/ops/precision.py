"""Numerics under mixed precision, and autograd functions under autocast.

``torch.autocast`` casts the inputs of the operations it knows (matmuls and
convolutions to float16/bfloat16, norms to float32). It does not see inside
a custom ``torch.autograd.Function``: there, a float32 parameter meets a
bfloat16 activation, and backward meets gradients of yet another dtype.
:func:`apply_without_autocast` gives every memory-saving function of mmsoft
the semantics of ``torch.amp.custom_fwd(cast_inputs=...)`` /
``custom_bwd`` (which torch < 2.4 has only for CUDA): under autocast the
floating inputs are cast once, to float32 or to autocast's dtype, and
forward and backward (:func:`backward_without_autocast`) run with autocast
off, so every operation inside sees one dtype.
"""
import functools
from typing import Callable, Optional

import torch

from ...utils.torch_compat import autocast_dtype

#: Dtypes that autocast casts between; float64 is left alone, as autocast does.
AUTOCAST_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Casts half/bfloat16 tensors to float32; float32/64 pass through."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def cast_floating(value, dtype: torch.dtype):
    """``value.to(dtype)`` for a float16/bfloat16/float32 tensor; anything
    else (float64, integer and bool tensors, non-tensors) unchanged."""
    if isinstance(value, torch.Tensor) and value.dtype in AUTOCAST_CASTABLE:
        return value.to(dtype)
    return value


def _device_type(args) -> str:
    return next(arg.device.type for arg in args if isinstance(arg, torch.Tensor))


def apply_without_autocast(function: type, *args, cast_to: Optional[str] = 'float32'):
    """``function.apply(*args)``, correct under ``torch.autocast``.

    Without autocast this is ``function.apply(*args)``. Under autocast the
    floating tensors among ``args`` are cast (float64 excepted) and the
    function runs with autocast off.

    Args:
        function (type): A ``torch.autograd.Function`` whose backward is
            wrapped in :func:`backward_without_autocast`.
        *args: Its arguments.
        cast_to (str, optional): ``'float32'`` (for functions documented
            to compute in full precision), ``'autocast'`` (autocast's
            float16/bfloat16: matmuls and convolutions), or None (the caller
            has cast what needs casting). Default: ``'float32'``.

    Returns:
        What ``function.apply`` returns.
    """
    device_type = _device_type(args)
    low = autocast_dtype(device_type)
    if low is None:
        return function.apply(*args)
    if cast_to is not None:
        dtype = torch.float32 if cast_to == 'float32' else low
        args = [cast_floating(arg, dtype) for arg in args]
    with torch.autocast(device_type=device_type, enabled=False):
        return function.apply(*args)


def backward_without_autocast(backward: Callable) -> Callable:
    """Decorates a ``backward(ctx, *grads)`` staticmethod to run with
    autocast off, as its forward did (see :func:`apply_without_autocast`),
    even when ``loss.backward()`` is called inside an autocast region."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.autocast(device_type=_device_type(grads), enabled=False):
            return backward(ctx, *grads)

    return wrapper
