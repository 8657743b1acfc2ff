"""Shared fixtures: small generated datasets, written once per test session."""
import os
import os.path as osp
import sys

import pytest
import torch

# Without a GPU, Triton's kernels run under its interpreter on CPU tensors
# (tests/helpers/triton_kernels.py): on before any test imports them.
if not torch.cuda.is_available():
    os.environ['TRITON_INTERPRET'] = '1'

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# The shared helpers (tests.helpers) and the peer configs' backbones
# (configs.comparison.peer_backbones) import from the checkout, ahead of the
# top-level ``tests`` package that mmsegmentation's wheel installs; the
# demo-data generators (tools/demo_data.py) and the cost-analysis package
# (tools/analysis/mmsoft_analysis) as the tools import them.
sys.path.insert(0, REPO_ROOT)
sys.path.append(osp.join(REPO_ROOT, 'tools'))
sys.path.append(osp.join(REPO_ROOT, 'tools', 'analysis'))


#: The tests that need a release only the stack environment has, beside
#: those of mmcv's compiled ops and mmpretrain: a part of their node id -> the
#: release. They are marked ``stack`` (``make test-stack`` runs them).
STACK_RELEASES = {
    'test_checkpoint_protection.py':
        "torch >= 2.6's weights_only loading with mmengine",
    'test_transformers_backbone.py':
        'transformers 4.51 (the newest environment has 5.x)',
    '[transformers-': 'transformers 4.51 (the newest environment has 5.x)',
    'test_metafiles.py::test_mim_': "OpenMMLab's mim (requirements/mim.txt)",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that needs mmcv's compiled ops needs OpenMMLab: ``mmcv_ops``
    implies ``openmmlab`` (deselected in the newest environment). A test of
    :data:`STACK_RELEASES` is marked ``stack``."""
    for item in items:
        if any(part in item.nodeid for part in STACK_RELEASES):
            item.add_marker(pytest.mark.stack)
        if item.get_closest_marker('mmcv_ops') and \
                not item.get_closest_marker('openmmlab'):
            item.add_marker(pytest.mark.openmmlab)


def pytest_addoption(parser):
    parser.addoption('--shard', metavar='K/N',
                     help='run the K-th of N parts of the selected tests (every N-th '
                     'from the K-th on); make test runs the floor suite as two')


def pytest_configure(config):
    shard = config.getoption('--shard')
    if shard:
        config.pluginmanager.register(Shard(shard), 'mmsoft-shard')


class Shard:
    """Keeps every N-th of the tests the markers selected, from the K-th on,
    so that N processes share a suite; tests of one file land in every part."""

    def __init__(self, spec: str):
        part, _, parts = spec.partition('/')
        if not (part.isdigit() and parts.isdigit() and 1 <= int(part) <= int(parts)):
            raise pytest.UsageError(f'--shard {spec}: expected K/N with 1 <= K <= N, '
                                    'e.g. 1/2')
        self.part, self.parts = int(part), int(parts)

    @pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs
    def pytest_collection_modifyitems(self, config, items):
        mine = [index % self.parts == self.part - 1 for index in range(len(items))]
        config.hook.pytest_deselected(
            items=[item for item, kept in zip(items, mine) if not kept])
        items[:] = [item for item, kept in zip(items, mine) if kept]


@pytest.fixture(scope='session')
def repo_root() -> str:
    """Absolute path of the repository."""
    return REPO_ROOT


@pytest.fixture(scope='session')
def small_coco(tmp_path_factory) -> str:
    """A generated COCO dataset: 16 train and 4 val images of 96x96 pixels."""
    from demo_data import generate_coco_demo
    root = str(tmp_path_factory.mktemp('demo_coco'))
    generate_coco_demo(root, num_train=16, num_val=4, seed=1, img_size=(96, 96))
    return root


@pytest.fixture(scope='session')
def mixed_coco(tmp_path_factory) -> str:
    """Like :func:`small_coco` with sides drawn from 48-96 pixels, so that
    every batch is padded."""
    from demo_data import generate_coco_demo
    root = str(tmp_path_factory.mktemp('demo_coco_mixed'))
    generate_coco_demo(root, num_train=16, num_val=4, seed=1, img_size=(96, 96),
                       img_side_range=(48, 96))
    return root


@pytest.fixture(scope='session')
def small_ade(tmp_path_factory) -> str:
    """A generated ADE20K-layout dataset: 12 training, 4 validation images."""
    from demo_data import generate_ade_demo
    root = str(tmp_path_factory.mktemp('demo_ade'))
    generate_ade_demo(root, num_train=12, num_val=4, seed=2, img_size=(96, 128))
    return root
