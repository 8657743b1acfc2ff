"""Load mmengine training checkpoints with ``torch.load(weights_only=True)``.

Since torch 2.6 ``torch.load`` only unpickles tensors, containers and an
allow-list of globals unless ``weights_only=False`` is passed. mmengine calls
``torch.load`` without that argument, and its full training checkpoints (the
ones written by ``CheckpointHook``, used by ``tools/test.py`` and
``--resume``) contain a few more globals:

* ``mmengine.logging.history_buffer.HistoryBuffer``: the logged scalars of the
  ``message_hub``. Its state holds the buffer's statistics methods, pickled as
  ``getattr(HistoryBuffer, 'mean')`` and so on.
* numpy arrays and scalars inside those buffers and the runtime info:
  ``numpy.ndarray``, ``numpy.dtype`` and the concrete numeric dtype classes,
  and ``_reconstruct``/``scalar`` from ``numpy.core.multiarray`` (numpy 1.x)
  or ``numpy._core.multiarray`` (numpy 2.x). Both spellings are registered,
  so checkpoints written under either numpy major version load under the
  other.

:func:`allow_mmengine_checkpoint_globals` allow-lists exactly these, keeping
``weights_only`` loading on for every file. ``import mmsoft`` calls it, so
that mmdet's and mmseg's own tools load these checkpoints once a config's
``custom_imports`` names mmsoft. The entries stay for the whole process;
mmsoft has no switch to skip them (``torch.serialization.clear_safe_globals``
empties torch's entire allow-list, these entries included).

``builtins.getattr`` is not allow-listed as such: a restricted stand-in
registered under that name only resolves the statistics methods of
``HistoryBuffer`` and rejects every other attribute lookup.
"""
import argparse
import pickle
from typing import Any, Callable, List, Mapping, Tuple, Union

import numpy as np
import torch

from .state_dict import unwrap_state_dict

#: Statistics methods ``HistoryBuffer`` registers on itself by default.
_DEFAULT_STATISTICS = ('min', 'max', 'current', 'mean')
_REGISTERED = False


def history_buffer_getattr(obj: Any, name: str) -> Callable:
    """``getattr`` restricted to ``HistoryBuffer``'s statistics methods.

    Registered as ``builtins.getattr`` for ``weights_only`` loading.

    Args:
        obj: Must be the ``HistoryBuffer`` class.
        name (str): A statistics method: ``min``, ``max``, ``current``,
            ``mean`` or one added through ``HistoryBuffer.register_statistics``.

    Returns:
        Callable: The method.

    Raises:
        pickle.UnpicklingError: For any other object or attribute.
    """
    from mmengine.logging import HistoryBuffer
    allowed = set(_DEFAULT_STATISTICS) | set(HistoryBuffer._statistics_methods)
    if obj is not HistoryBuffer or not isinstance(name, str) or name not in allowed:
        raise pickle.UnpicklingError(
            f'weights_only load: getattr({obj!r}, {name!r}) is not allowed; only '
            f'the statistics methods of HistoryBuffer ({sorted(allowed)}) are.')
    return getattr(HistoryBuffer, name)


def _numpy_multiarray() -> List[Tuple[Callable, str]]:
    """``_reconstruct`` and ``scalar`` under both numpy module spellings."""
    try:  # numpy >= 2.0 (1.26 ships it as an alias of numpy.core)
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - numpy < 1.26
        from numpy.core import multiarray
    entries = []
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        for name in ('_reconstruct', 'scalar'):
            entries.append((getattr(multiarray, name), f'{module}.{name}'))
    return entries


def _numeric_dtype_classes() -> List[type]:
    """Concrete dtype classes of booleans, integers and floats (incl. complex)."""
    codes = '?' + np.typecodes['AllInteger'] + np.typecodes['AllFloat']
    return sorted({type(np.dtype(code)) for code in codes}, key=str)


def checkpoint_safe_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
    """The globals mmengine checkpoints need, in ``add_safe_globals`` form.

    Returns:
        list: Classes/functions, or ``(object, 'module.qualname')`` pairs for
        those registered under a name other than their own.
    """
    from mmengine.logging import HistoryBuffer
    return [
        HistoryBuffer,
        np.ndarray,
        np.dtype,
        *_numeric_dtype_classes(),
        *_numpy_multiarray(),
        (history_buffer_getattr, 'builtins.getattr'),
    ]


def allow_mmengine_checkpoint_globals() -> None:
    """Allow-lists :func:`checkpoint_safe_globals` for ``torch.load``.

    Adds them to torch's process-wide ``weights_only`` allow-list
    (``torch.serialization.add_safe_globals``). ``import mmsoft`` calls this.
    Idempotent; a no-op on torch versions without ``add_safe_globals``.
    """
    global _REGISTERED
    if _REGISTERED or not hasattr(torch.serialization, 'add_safe_globals'):
        return
    torch.serialization.add_safe_globals(checkpoint_safe_globals())
    _REGISTERED = True


def load_checkpoint_safely(path: str, map_location: str = 'cpu') -> Any:
    """Loads ``path`` with ``weights_only=True`` and explains failures.

    Args:
        path (str): Checkpoint file.
        map_location (str): Passed to ``torch.load``. Default: ``'cpu'``.

    Returns:
        The unpickled object.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The file is empty, truncated, not a torch checkpoint, or
            holds objects outside the allow-list; the message names the file
            and the reason.
    """
    import os
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    if os.path.getsize(path) == 0:
        raise ValueError(f'checkpoint file {path} is empty (0 bytes)')
    allow_mmengine_checkpoint_globals()
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f'checkpoint file {path} contains objects outside the allow-list for '
            f'weights_only loading (not an mmengine/PyTorch checkpoint?): '
            f'{_first_line(exc)}') from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ValueError(
            f'checkpoint file {path} could not be read; it is truncated, corrupt '
            f'or not a PyTorch checkpoint ({type(exc).__name__}: '
            f'{_first_line(exc)})') from exc


def _first_line(exc: BaseException) -> str:
    """The informative line of a (possibly long) torch.load error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if any(key in line for key in ('Unsupported', 'Trying to', 'not allowed',
                                       'failed finding', 'failed reading')):
            return line.replace('WeightsUnpickler error: ', '')
    return lines[0] if lines else type(exc).__name__


def load_state_dict_safely(path: str, map_location: str = 'cpu') -> dict:
    """Loads a model checkpoint and returns its state dict.

    Accepts mmengine checkpoints (``{'state_dict': ..., 'meta': ...}``),
    ``{'model': ...}`` and bare state dicts.

    Args:
        path (str): Checkpoint file.
        map_location (str): Passed to ``torch.load``. Default: ``'cpu'``.

    Returns:
        dict: Parameter name to tensor.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: Unreadable file (see :func:`load_checkpoint_safely`) or
            content that is not a state dict of tensors.
    """
    obj = load_checkpoint_safely(path, map_location)
    if not isinstance(obj, dict):
        raise ValueError(f'checkpoint file {path} is not a model checkpoint: it '
                         f'holds a {type(obj).__name__}, expected a dict')
    state_dict, _ = unwrap_state_dict(obj)
    tensors = {k: v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f'checkpoint file {path} holds no model weights (no '
                         f"tensors under 'state_dict', 'model' or at the top "
                         f'level; keys: {sorted(map(str, obj))[:8]})')
    return tensors


def load_checkpoint_file(filename: str, map_location='cpu') -> Mapping:
    """Loads a checkpoint with mmengine's loaders (paths, URLs, ...).

    Tensors are unpickled with ``weights_only`` semantics and the globals of
    :func:`allow_mmengine_checkpoint_globals`; ``argparse.Namespace`` is
    allowed in addition, as timm training checkpoints store their arguments
    as one.

    Args:
        filename (str): Path or URL (anything mmengine's ``CheckpointLoader``
            reads).
        map_location: As for ``torch.load``. Default: ``'cpu'``.

    Returns:
        Mapping: The loaded checkpoint.

    Raises:
        FileNotFoundError: A local ``filename`` does not exist (mmengine's
            message: ``'<filename> can not be found.'``).
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    allow_mmengine_checkpoint_globals()
    with torch.serialization.safe_globals([argparse.Namespace]):
        return CheckpointLoader.load_checkpoint(filename, map_location=map_location)
