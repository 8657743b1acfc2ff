"""Host-device synchronisations inside the backbones, counted on the CPU
(:class:`~tests.helpers.host_syncs.HostSyncCounter`)."""
import os.path as osp
from collections import Counter

import pytest
import torch

from mmsoft.ops import kernel_inverse as soft_kernels
from tests.helpers.host_syncs import PACKAGE_DIR, HostSyncCounter

from tests.helpers.small_backbones import BACKBONES, IMAGE_SIZE, VALID_SHAPES


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


class _SyncingBackward(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad.sum().item()
        return grad * 2


def test_counter_sees_syncs_in_backward():
    """The training-step tests count what autograd's backward runs too."""
    x = torch.ones(3, requires_grad=True)
    with HostSyncCounter() as counter:
        loss = _SyncingBackward.apply(x).sum()
        assert dict(counter.counts) == {}
        loss.backward()
    assert sum(counter.counts.values()) == 1


def _sync_in(relative_path: str, values: torch.Tensor) -> None:
    """Reads ``values`` on the host from code whose file is ``relative_path``
    in the mmsoft package, as a sync there would."""
    code = compile('bool(values.sum() > 0)\n', osp.join(PACKAGE_DIR, relative_path),
                   'exec')
    exec(code, {'values': values})


def _function_in(path: str, body: str, **names):
    """A function ``f()`` running ``body`` whose code is in file ``path``."""
    scope = dict(names)
    exec(compile(f'def f():\n    {body}\n', path, 'exec'), scope)
    return scope['f']


def test_the_line_that_asked_is_counted_not_its_library_caller(tmp_path):
    """A sync that torch's own Python code makes for an mmsoft line counts
    there; one that another library makes when an mmsoft subclass calls it
    (mmdet's preprocessing under the valid-region preprocessor) does not."""
    values = torch.ones(3)
    in_torch = _function_in(osp.join(osp.dirname(torch.__file__), 'fake.py'),
                            'values.tolist()', values=values)
    in_mmdet = _function_in(str(tmp_path / 'mmdet' / 'preprocessor.py'),
                            'values.tolist()', values=values)
    adapter = osp.join(PACKAGE_DIR, 'openmmlab', 'backbones.py')
    with HostSyncCounter() as counter:
        _function_in(adapter, 'in_torch()', in_torch=in_torch)()
        _function_in(adapter, 'in_mmdet()', in_mmdet=in_mmdet)()
    assert dict(counter.counts) == {('tolist', 'openmmlab/backbones.py:2'): 1,
                                    ('tolist', '(outside mmsoft)'): 1}


def test_counts_are_attributed_to_the_package_file():
    values = torch.ones(3)
    with HostSyncCounter() as counter:
        _sync_in('models/soft.py', values)
        _sync_in('openmmlab/backbones.py', values)
        values[0].item()  # here, in tests/: outside the package
    in_soft = ('_local_scalar_dense', 'models/soft.py:1')
    in_adapter = ('_local_scalar_dense', 'openmmlab/backbones.py:1')
    assert counter.in_files('models/') == {in_soft: 1}
    assert counter.in_files('models/soft.py', 'openmmlab/') == {in_soft: 1,
                                                                in_adapter: 1}
    assert counter.in_files('utils/') == {}
    assert counter.counts[('_local_scalar_dense', '(outside mmsoft)')] == 1


@pytest.mark.parametrize('prefixes', [('models/backbones/', ), ('models/', 'layers/'),
                                      ('mmsoft/models/', )])
def test_a_prefix_that_matches_no_package_file_raises(prefixes):
    with HostSyncCounter() as counter:
        pass
    missing = prefixes[-1]
    with pytest.raises(ValueError, match=rf"prefix='{missing}' matches no file of "
                       r"the mmsoft package .*'models/'"):
        counter.in_files(*prefixes)
    with pytest.raises(ValueError, match='at least one prefix'):
        counter.in_files()


def test_small_soft_backbones_run_the_solver_a_gpu_runs():
    """The sync tests run SOFT with ``'newton'``: what a GPU runs for every
    Newton solver (the closed form's eigendecomposition runs on the CPU only)."""
    gpu_solvers = {soft_kernels.solver_that_runs(solver, 'cuda')
                   for solver in ('newton', 'newton_closed_form')}
    assert gpu_solvers == {'newton'}
    solvers = {backbone.solver for build in BACKBONES.values()
               for backbone in [build()] if hasattr(backbone, 'solver')}
    assert solvers == gpu_solvers


def test_small_backbones_cover_every_model_and_variant():
    import mmsoft.models
    built = [build() for build in BACKBONES.values()]
    models = {name for name in mmsoft.models.__all__
              if isinstance(getattr(mmsoft.models, name), type)}
    assert {type(backbone).__name__ for backbone in built} == models
    assert {backbone.variant for backbone in built if hasattr(backbone, 'variant')} \
        == set(soft_kernels.VARIANTS)


@pytest.mark.parametrize('name', list(BACKBONES))
def test_inference_makes_no_host_sync(name):
    torch.manual_seed(0)
    backbone = BACKBONES[name]().eval()
    images = torch.randn(2, 3, *IMAGE_SIZE)
    with torch.no_grad(), HostSyncCounter() as counter:
        outs = backbone(images, VALID_SHAPES)
    assert len(outs) == 4
    assert dict(counter.counts) == {}


@pytest.mark.parametrize('name', list(BACKBONES))
def test_training_step_makes_no_host_sync(name):
    torch.manual_seed(0)
    backbone = BACKBONES[name]().train()
    images = torch.randn(2, 3, *IMAGE_SIZE)
    with HostSyncCounter() as counter:
        outs = backbone(images, VALID_SHAPES)
        sum(out.mean() for out in outs).backward()
    assert dict(counter.counts) == {}
