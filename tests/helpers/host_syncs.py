"""Counting, on the CPU, what would synchronise a GPU with the host.

On a GPU, reading a tensor's value on the host (``item``, ``bool``,
``tolist``, ``cpu``, ``numpy``, ``nonzero``) or copying Python data to the
device (``torch.tensor([...], device=...)``) stalls the host until the
device's queue drains. On the CPU they cost nothing, but the operations
still pass through torch's dispatcher, where :class:`HostSyncCounter` sees
them: what ``torch.cuda.set_sync_debug_mode('error')`` would flag on a GPU.
"""
import functools
import inspect
import os
import os.path as osp
import sysconfig
from collections import Counter
from typing import List

import torch
from torch.overrides import TorchFunctionMode

import mmsoft
from torch.utils._python_dispatch import TorchDispatchMode

#: aten operations that read a device tensor's values on the host.
READS = ('_local_scalar_dense', 'nonzero', 'masked_select')
#: Tensor methods that hand a tensor's values to Python (no aten call on CPU).
HANDS_TO_PYTHON = ('tolist', 'cpu', 'numpy')


#: The folder of the mmsoft package; counts name files relative to it.
PACKAGE_DIR = osp.dirname(osp.realpath(mmsoft.__file__))


def _folders(*paths: str) -> tuple:
    return tuple(osp.realpath(path) + os.sep for path in paths)


#: Frames that act for their caller: torch's Python code, this counter
#: and the standard library (not its site-packages).
_PASS_THROUGH = _folders(osp.dirname(torch.__file__)) + (osp.realpath(__file__), )
_STDLIB = _folders(sysconfig.get_paths()['stdlib'])
_SITE_PACKAGES = _folders(sysconfig.get_paths()['purelib'],
                          sysconfig.get_paths()['platlib'])


def package_files() -> List[str]:
    """The files of the mmsoft package on disk, relative to the package
    (``'models/soft.py'``); ``__pycache__`` and hidden folders (``.mim``)
    left out."""
    files = []
    for folder, subfolders, names in os.walk(PACKAGE_DIR):
        subfolders[:] = sorted(name for name in subfolders
                               if name != '__pycache__' and not name.startswith('.'))
        rel = osp.relpath(folder, PACKAGE_DIR)
        files += [name if rel == '.' else f'{rel}/{name}'.replace(os.sep, '/')
                  for name in sorted(names)]
    return files


@functools.lru_cache(maxsize=None)
def _real_path(filename: str) -> str:
    return osp.realpath(filename)


@functools.lru_cache(maxsize=None)
def _passes_through(path: str) -> bool:
    """Whether the frame of file ``path`` (a real path) acts for its caller."""
    return path.startswith(_PASS_THROUGH) or (
        path.startswith(_STDLIB) and not path.startswith(_SITE_PACKAGES))


def _caller() -> str:
    """The line that asked for the current operation: the innermost frame
    outside torch and the standard library, as ``file:line`` relative to
    the package when it is mmsoft's, else ``'(outside mmsoft)'`` (mmdet's
    preprocessing that an mmsoft subclass calls is mmdet's)."""
    frame = inspect.currentframe().f_back
    while frame is not None:
        path = _real_path(frame.f_code.co_filename)
        if not _passes_through(path):
            if path.startswith(PACKAGE_DIR + os.sep):
                rel = osp.relpath(path, PACKAGE_DIR).replace(os.sep, '/')
                return f'{rel}:{frame.f_lineno}'
            break
        frame = frame.f_back
    return '(outside mmsoft)'


class _Dispatch(TorchDispatchMode):

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        # lift_fresh of a tensor with elements: one made from Python data.
        if name in READS or (name == 'lift_fresh' and args[0].dim() > 0):
            self.counts[(name, _caller())] += 1
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, '__name__', None) in HANDS_TO_PYTHON:
            self.counts[(func.__name__, _caller())] += 1
        return func(*args, **(kwargs or {}))


class HostSyncCounter:
    """Counts, while active, each operation that would synchronise a GPU
    with the host, by kind and by the line that asked for it (an mmsoft
    ``file:line``, or ``'(outside mmsoft)'``)."""

    def __init__(self):
        self.counts = Counter()
        self._modes = [_Function(self.counts), _Dispatch(self.counts)]

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def in_files(self, *prefixes: str) -> dict:
        """The counts made by mmsoft lines in files under ``prefixes``.

        Args:
            *prefixes (str): Paths relative to the package, e.g.
                ``'models/'`` or ``'openmmlab/backbones.py'``.

        Raises:
            ValueError: When no prefix is given, or a prefix matches no file
                of the mmsoft package on disk (it would count nothing).
        """
        if not prefixes:
            raise ValueError('in_files() needs at least one prefix, e.g. '
                             "'models/'.")
        files = package_files()
        for prefix in prefixes:
            if not isinstance(prefix, str) or not any(f.startswith(prefix)
                                                      for f in files):
                folders = sorted({f.split('/')[0] + '/' for f in files if '/' in f})
                modules = sorted(f for f in files if '/' not in f)
                raise ValueError(
                    f'prefix={prefix!r} matches no file of the mmsoft package in '
                    f'{PACKAGE_DIR}; expected the start of a path relative to '
                    f'it, e.g. one of {folders + modules}.')
        return {key: count for key, count in self.counts.items()
                if key[1].startswith(prefixes)}
