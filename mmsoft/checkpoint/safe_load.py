"""``torch.load(weights_only=True)`` of mmengine training checkpoints.

They hold ``HistoryBuffer`` and numpy arrays, dtypes and scalars. Torch >=
2.6 loads them through its allow-list. For torch 2.1 to 2.5 a restricted
unpickler resolves the same globals, also as mmengine's local loader.
"""
import _compat_pickle
import argparse
import codecs
import importlib.util
import os.path as osp
import pickle
import types
from typing import Any, Callable, List, Mapping, Sequence

import torch

from ..utils.torch_compat import TORCH_VERSION

#: Whether torch's allow-list takes ``(object, 'module.name')`` entries and
#: ``weights_only=True`` is the default.
NATIVE_SAFE_GLOBALS = TORCH_VERSION >= (2, 6)
_REGISTERED = []


def history_buffer_getattr(obj: Any, name: str) -> Callable:
    """``getattr`` of ``HistoryBuffer``'s statistics methods alone, allowed as
    ``builtins.getattr``."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}
    if obj is not HistoryBuffer or not isinstance(name, str) or name not in allowed:
        raise pickle.UnpicklingError(
            f'weights_only load: getattr({obj!r}, {name!r}) is not allowed; only '
            f'the statistics methods of HistoryBuffer ({sorted(allowed)}) are.')
    return getattr(HistoryBuffer, name)


def checkpoint_safe_globals() -> List:
    """The globals of mmengine checkpoints, as ``add_safe_globals`` takes them."""
    import numpy as np
    try:
        from numpy._core import multiarray  # numpy >= 1.26
    except ImportError:
        from numpy.core import multiarray
    codes = '?' + np.typecodes['AllInteger'] + np.typecodes['AllFloat']
    dtypes = sorted({type(np.dtype(code)) for code in codes}, key=str)
    entries = [np.ndarray, np.dtype, *dtypes]
    entries += [(getattr(multiarray, name), f'{module}.{name}')
                for module in ('numpy.core.multiarray', 'numpy._core.multiarray')
                for name in ('_reconstruct', 'scalar')]
    if importlib.util.find_spec('mmengine') is not None:
        from mmengine.logging import HistoryBuffer
        entries += [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr')]
    return entries


def _restricted_pickle(extra: Sequence) -> types.ModuleType:
    """A ``pickle_module`` resolving torch's weights-only globals, those of
    mmengine checkpoints and ``extra``."""
    from torch import _weights_only_unpickler
    allowed = dict(_weights_only_unpickler._get_allowed_globals())
    allowed['_codecs.encode'] = codecs.encode  # byte strings of protocol 2
    for entry in [*checkpoint_safe_globals(), *extra]:
        obj, name = entry if isinstance(entry, tuple) else (
            entry, f'{entry.__module__}.{entry.__qualname__}')
        allowed[name] = obj

    class Unpickler(pickle.Unpickler):

        def find_class(self, module: str, name: str) -> Callable:
            # Python 2 names of protocol-2 pickles, as pickle maps them.
            module, name = _compat_pickle.NAME_MAPPING.get((module, name),
                                                           (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            if f'{module}.{name}' not in allowed:
                raise pickle.UnpicklingError(
                    f'Unsupported global: GLOBAL {module}.{name} is not allowed for '
                    'weights_only loading (see mmsoft.checkpoint.safe_load).')
            return allowed[f'{module}.{name}']

    module = types.ModuleType('mmsoft_restricted_pickle')
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    return module


def weights_only_load(file, map_location=None, extra: Sequence = ()) -> Any:
    """``torch.load`` of tensors and mmengine's globals, and of ``extra`` for
    this load only."""
    if NATIVE_SAFE_GLOBALS:
        allow_mmengine_checkpoint_globals()
        with torch.serialization.safe_globals(list(extra)):
            return torch.load(file, map_location=map_location, weights_only=True)
    return torch.load(file, map_location=map_location, weights_only=False,
                      pickle_module=_restricted_pickle(extra))


def load_from_local(filename: str, map_location=None) -> Any:
    """mmengine's loader of local files, weights only (torch < 2.6)."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return weights_only_load(filename, map_location)


def allow_mmengine_checkpoint_globals() -> None:
    """Lets torch (>= 2.6: its allow-list) and mmengine (older torch: its
    local loader) load mmengine checkpoints with ``weights_only``."""
    if _REGISTERED:
        return
    if NATIVE_SAFE_GLOBALS:
        torch.serialization.add_safe_globals(checkpoint_safe_globals())
    else:
        from mmengine.runner.checkpoint import CheckpointLoader
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local,
                                         force=True)
    _REGISTERED.append(True)


def load_checkpoint_file(filename: str, map_location='cpu') -> Mapping:
    """A local file by :func:`weights_only_load` (timm's ``argparse.Namespace``
    allowed), a URL by mmengine's ``CheckpointLoader``."""
    if osp.isfile(osp.expanduser(filename)):
        return weights_only_load(osp.expanduser(filename), map_location,
                                 extra=[argparse.Namespace])
    from mmengine.runner.checkpoint import CheckpointLoader
    allow_mmengine_checkpoint_globals()
    return CheckpointLoader.load_checkpoint(filename, map_location=map_location)


def load_checkpoint_safely(path: str, map_location: str = 'cpu') -> Any:
    """Loads ``path`` weights-only; a ``ValueError`` names the file and why
    it cannot (empty, truncated, foreign, outside the allow-list)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    if osp.getsize(path) == 0:
        raise ValueError(f'checkpoint file {path} is empty (0 bytes)')
    try:
        return weights_only_load(path, map_location)
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
    """The informative line of a ``torch.load`` error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if any(key in line for key in ('Unsupported', 'Trying to', 'not allowed',
                                       'failed finding', 'failed reading')):
            return line.replace('WeightsUnpickler error: ', '')
    return lines[0] if lines else type(exc).__name__
