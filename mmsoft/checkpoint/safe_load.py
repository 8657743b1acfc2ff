"""``weights_only`` loading of mmengine training checkpoints.

:func:`allow_mmengine_checkpoint_globals` (called before a runner is built) adds to
torch's allow-list the globals mmengine checkpoints hold: ``HistoryBuffer``,
numpy arrays, dtypes and scalars (under the numpy 1.x and 2.x module names),
and a ``getattr`` restricted to ``HistoryBuffer``'s statistics methods. On
torch < 2.6, :class:`RestrictedUnpickler` resolves only these and torch's own
weights-only globals, and mmengine's loader of local files uses it.
"""
import _compat_pickle
import argparse
import codecs
import importlib.util
import os.path as osp
import pickle
import types
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple, Union

import torch

from ..utils.torch_compat import has_native_weights_only_globals
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
    import numpy as np  # torch does not require numpy; a checkpoint's arrays do
    codes = '?' + np.typecodes['AllInteger'] + np.typecodes['AllFloat']
    return sorted({type(np.dtype(code)) for code in codes}, key=str)


def checkpoint_safe_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
    """The globals mmengine checkpoints need, in ``add_safe_globals`` form.

    Where mmengine is not installed, its ``HistoryBuffer`` (and the
    ``getattr`` that reads its statistics) cannot be unpickled anyway and are
    left out: plain state dicts still load, and a file that names them fails
    with torch's ``UnpicklingError`` naming the global.

    Returns:
        list: Classes/functions, or ``(object, 'module.qualname')`` pairs for
        those registered under a name other than their own.
    """
    import numpy as np  # torch does not require numpy; a checkpoint's arrays do
    entries = [np.ndarray, np.dtype, *_numeric_dtype_classes(), *_numpy_multiarray()]
    if importlib.util.find_spec('mmengine') is not None:
        from mmengine.logging import HistoryBuffer
        entries += [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr')]
    return entries


def _qualified_name(entry: Union[Callable, Tuple[Callable, str]]) -> str:
    """The ``module.qualname`` an allow-list entry is registered under."""
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


def allowed_globals(extra: Sequence[Callable] = ()) -> Dict[str, Callable]:
    """Every global a weights-only load resolves: torch's own (tensors,
    storages, dtypes, ``OrderedDict``, ...), :func:`checkpoint_safe_globals`
    and ``extra``, by the name a pickle refers to them.

    Args:
        extra (Sequence[Callable]): More classes or functions to allow.

    Returns:
        dict[str, Callable]: ``'module.qualname'`` to object.
    """
    from torch import _weights_only_unpickler
    allowed = dict(_weights_only_unpickler._get_allowed_globals())
    # Byte strings in protocol-2 pickles (numpy arrays' data), which torch's
    # weights-only unpickler reads natively.
    allowed.setdefault('_codecs.encode', codecs.encode)
    for entry in [*checkpoint_safe_globals(), *extra]:
        obj = entry[0] if isinstance(entry, tuple) else entry
        allowed[_qualified_name(entry)] = obj
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``allowed``.

    Used by :func:`weights_only_load` on torch < 2.6, with ``allowed`` set
    to :func:`allowed_globals` once per load. A pickle naming any other
    global (``os.system``, ``builtins.eval``, ...) is refused with
    :class:`pickle.UnpicklingError` before anything is called.
    """

    allowed: Dict[str, Callable] = {}

    def find_class(self, module: str, name: str) -> Callable:
        # Python 2 names of protocol-2 pickles (torch's default protocol),
        # e.g. ``__builtin__.getattr``, as pickle's own find_class maps them.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full_name = f'{module}.{name}'
        if full_name not in self.allowed:
            raise pickle.UnpicklingError(
                f'Unsupported global: GLOBAL {full_name} is not allowed for '
                f'weights_only loading (allowed: torch\'s tensor globals and '
                f'those of mmengine checkpoints, see '
                f'mmsoft.checkpoint.safe_load.checkpoint_safe_globals).')
        return self.allowed[full_name]


def _restricted_pickle_module(extra: Sequence[Callable]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler is restricted."""
    unpickler = type('RestrictedUnpickler', (RestrictedUnpickler, ),
                     dict(allowed=allowed_globals(extra)))
    module = types.ModuleType('mmsoft_restricted_pickle')
    module.Unpickler = unpickler
    module.load = lambda file, **kwargs: unpickler(file, **kwargs).load()
    return module


def weights_only_load(file, map_location=None, extra: Sequence[Callable] = ()) -> Any:
    """``torch.load`` restricted to tensors and :func:`allowed_globals`.

    Args:
        file: Path or file object.
        map_location: As for ``torch.load``.
        extra (Sequence[Callable]): More globals allowed for this load only.

    Returns:
        The unpickled object.

    Raises:
        pickle.UnpicklingError: The file names a global outside the list.
    """
    if has_native_weights_only_globals():
        allow_mmengine_checkpoint_globals()
        with torch.serialization.safe_globals(list(extra)):
            return torch.load(file, map_location=map_location, weights_only=True)
    return torch.load(file, map_location=map_location, weights_only=False,
                      pickle_module=_restricted_pickle_module(extra))


def load_from_local(filename: str, map_location=None) -> Any:
    """mmengine's loader of local files (same name, so that its log line reads
    "by local backend"), with :func:`weights_only_load`.

    Registered in ``CheckpointLoader`` on torch < 2.6 (see the module
    docstring); the same message as mmengine's for a missing file.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return weights_only_load(filename, map_location)


def allow_mmengine_checkpoint_globals() -> None:
    """Makes ``torch.load`` and mmengine load mmengine checkpoints safely.

    On torch >= 2.6, adds :func:`checkpoint_safe_globals` to torch's
    process-wide ``weights_only`` allow-list
    (``torch.serialization.add_safe_globals``). On older torch, registers
    :func:`load_from_local` as mmengine's loader of local files. See
    the module docstring. :func:`mmsoft.apis.build_runner` calls this; idempotent.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    if has_native_weights_only_globals():
        torch.serialization.add_safe_globals(checkpoint_safe_globals())
    else:
        from mmengine.runner.checkpoint import CheckpointLoader
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local,
                                         force=True)
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
    if osp.isfile(osp.expanduser(filename)):  # needs only torch
        return weights_only_load(osp.expanduser(filename), map_location,
                                 extra=[argparse.Namespace])
    from mmengine.runner.checkpoint import CheckpointLoader
    allow_mmengine_checkpoint_globals()  # a URL, or a missing file's error
    return CheckpointLoader.load_checkpoint(filename, map_location=map_location)
