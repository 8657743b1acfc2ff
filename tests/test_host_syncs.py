"""Host-device synchronisations inside the backbones, counted on the CPU.

On a GPU, reading a tensor's value on the host (``item``, ``bool``,
``tolist``, ``cpu``, ``numpy``, ``nonzero``) or copying Python data to the
device (``torch.tensor([...], device=...)``) stalls the host until the
device's queue drains. On the CPU they cost nothing, but the operations
still pass through torch's dispatcher, where :class:`HostSyncCounter` sees
them: what ``torch.cuda.set_sync_debug_mode('error')`` would flag on a GPU.
"""
import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmsoft.models.backbones import SOFT, UFOViT

#: aten operations that read a device tensor's values on the host.
READS = ('_local_scalar_dense', 'nonzero', 'masked_select')
#: Tensor methods that hand a tensor's values to Python (no aten call on CPU).
HANDS_TO_PYTHON = ('tolist', 'cpu', 'numpy')


def _caller() -> str:
    """The innermost mmsoft frame of the current stack, as ``file:line``."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if '/mmsoft/' in frame.filename and '/tests/' not in frame.filename:
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


def test_counter_sees_every_kind_of_sync():
    values = torch.ones(3)
    with HostSyncCounter() as counter:
        bool(values.sum() > 0)
        values[0].item()
        values.tolist()
        values.cpu()
        values.numpy()
        values.nonzero()
        torch.tensor([1, 2])
        torch.arange(3) < 2  # no sync
    kinds = Counter()
    for (kind, _), count in counter.counts.items():
        kinds[kind] += count
    assert kinds == {'_local_scalar_dense': 2, 'tolist': 1, 'cpu': 1, 'numpy': 1,
                     'nonzero': 1, 'lift_fresh': 1}


SMALL_SOFT = dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
                  depths=[1, 1, 1, 1])
# 'newton': what a GPU runs for 'newton_closed_form' too (CLOSED_FORM_DEVICES:
# the eigendecomposition, whose backward gathers the close eigenvalue pairs,
# runs on the CPU only). 'exact' is left out: torch's LAPACK calls check
# their results on the host.
BACKBONES = {
    'soft++-newton': lambda: SOFT(SMALL_SOFT, attention='soft++', solver='newton',
                                  drop_path_rate=0.),
    'soft-newton': lambda: SOFT(SMALL_SOFT, attention='soft', solver='newton',
                                drop_path_rate=0.),
    'ufo-vit': lambda: UFOViT(dict(embed_dims=48, depth=4, num_heads=2)),
}
#: Batch 2 with valid regions, as the configs' data preprocessors give.
VALID_SHAPES = [(64, 96), (48, 64)]


@pytest.mark.parametrize('name', list(BACKBONES))
def test_inference_makes_no_host_sync(name):
    torch.manual_seed(0)
    backbone = BACKBONES[name]().eval()
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad(), HostSyncCounter() as counter:
        outs = backbone(images, VALID_SHAPES)
    assert len(outs) == 4
    assert dict(counter.counts) == {}


#: The one check left in training: the memory-saving LayerNorm reads
#: whether every |gamma| is large enough to rebuild its input from its
#: output (mmsoft/models/memory_efficient/layer_norm.py, rebuilds_input).
LAYER_NORM_CHECK = 'models/memory_efficient/layer_norm.py'


@pytest.mark.parametrize('name', list(BACKBONES))
def test_training_step_syncs_only_in_the_layer_norm_check(name):
    torch.manual_seed(0)
    backbone = BACKBONES[name]().train()
    images = torch.randn(2, 3, 64, 96)
    with HostSyncCounter() as counter:
        outs = backbone(images, VALID_SHAPES)
        sum(out.mean() for out in outs).backward()
    others = {key: count for key, count in counter.counts.items()
              if not key[1].startswith(LAYER_NORM_CHECK)}
    assert others == {}
