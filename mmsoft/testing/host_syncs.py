"""Counting, on the CPU, what would synchronise a GPU with the host.

On a GPU, reading a tensor's value on the host (``item``, ``bool``,
``tolist``, ``cpu``, ``numpy``, ``nonzero``) or copying Python data to the
device (``torch.tensor([...], device=...)``) stalls the host until the
device's queue drains. On the CPU they cost nothing, but the operations
still pass through torch's dispatcher, where :class:`HostSyncCounter` sees
them: what ``torch.cuda.set_sync_debug_mode('error')`` would flag on a GPU.
"""
import traceback
from collections import Counter

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: aten operations that read a device tensor's values on the host.
READS = ('_local_scalar_dense', 'nonzero', 'masked_select')
#: Tensor methods that hand a tensor's values to Python (no aten call on CPU).
HANDS_TO_PYTHON = ('tolist', 'cpu', 'numpy')


def _caller() -> str:
    """The innermost mmsoft frame of the current stack, as ``file:line``."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if ('/mmsoft/' in frame.filename and '/tests/' not in frame.filename
                and '/mmsoft/testing/' not in frame.filename):
            return f'{frame.filename.split("/mmsoft/")[-1]}:{frame.lineno}'
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
    with the host, by kind and by the mmsoft line that made it."""

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
        """The counts made by mmsoft lines in files under ``prefixes``
        (paths relative to the package, e.g. ``'models/backbones/'``)."""
        return {key: count for key, count in self.counts.items()
                if key[1].startswith(prefixes)}
