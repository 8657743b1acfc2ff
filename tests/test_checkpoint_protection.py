"""The same checkpoint protection on every supported torch (2.1 to 2.15).

An mmengine training checkpoint (message hub with ``HistoryBuffer``, numpy
arrays and scalars) loads through mmengine's own loader and mmsoft's, and a
pickle that names any other global is refused by both, before anything in it
runs. On torch >= 2.6 this is torch's ``weights_only`` loading with mmsoft's
allow-list; before, mmsoft's restricted unpickler, registered as mmengine's
loader of local files.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import argparse
import os
import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader, load_checkpoint

from mmsoft.checkpoint import allow_mmengine_checkpoint_globals

# What the tools' runners do before they load a checkpoint.
allow_mmengine_checkpoint_globals()
from mmsoft.checkpoint import load_checkpoint_file, load_checkpoint_safely
from mmsoft.checkpoint.safe_load import (NATIVE_SAFE_GLOBALS, load_from_local,
                                         weights_only_load)

pytestmark = pytest.mark.openmmlab


def mmengine_checkpoint(path) -> str:
    """A checkpoint with what ``CheckpointHook`` writes besides the weights."""
    losses = HistoryBuffer()
    for value in (1.5, np.float64(2.0), 0.5):
        losses.update(value)
    torch.save({'meta': dict(epoch=3, iter=24, seed=np.int64(7),
                             hw=np.array([96, 128])),
                'state_dict': {'weight': torch.arange(6.).view(2, 3),
                               'bias': torch.ones(2)},
                'message_hub': {'log_scalars': {'train/loss': losses}}},
               str(path))
    return str(path)


class Payload:
    """Pickles as a call to ``os.system`` that creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / 'ran'
    path = tmp_path / 'crafted.pth'
    torch.save({'state_dict': {'weight': torch.ones(1)}, 'meta': Payload(marker)},
               str(path))
    return str(path), marker


LOADERS = {
    'mmengine CheckpointLoader': lambda path: CheckpointLoader.load_checkpoint(
        path, map_location='cpu'),
    'mmsoft load_checkpoint_safely': load_checkpoint_safely,
    'mmsoft load_checkpoint_file': load_checkpoint_file,
}


@pytest.mark.parametrize('loader', list(LOADERS))
def test_mmengine_checkpoints_load(loader, tmp_path):
    checkpoint = LOADERS[loader](mmengine_checkpoint(tmp_path / 'epoch_3.pth'))
    assert checkpoint['meta']['epoch'] == 3 and int(checkpoint['meta']['seed']) == 7
    assert checkpoint['meta']['hw'].tolist() == [96, 128]
    torch.testing.assert_close(checkpoint['state_dict']['weight'],
                               torch.arange(6.).view(2, 3))
    losses = checkpoint['message_hub']['log_scalars']['train/loss']
    assert losses.mean() == pytest.approx(4 / 3) and losses.current() == 0.5


@pytest.mark.parametrize('loader', list(LOADERS))
def test_crafted_pickles_are_refused_before_running(loader, crafted):
    path, marker = crafted
    with pytest.raises((pickle.UnpicklingError, ValueError),
                       match='GLOBAL posix.system|allow-list'):
        LOADERS[loader](path)
    assert not marker.exists()


def test_mmengine_load_checkpoint_into_a_model(tmp_path, crafted):
    path = mmengine_checkpoint(tmp_path / 'epoch_3.pth')
    model = torch.nn.Linear(3, 2)
    load_checkpoint(model, path, map_location='cpu')
    torch.testing.assert_close(model.weight.detach(), torch.arange(6.).view(2, 3))
    with pytest.raises((pickle.UnpicklingError, ValueError)):
        load_checkpoint(model, crafted[0], map_location='cpu')
    assert not crafted[1].exists()


def test_extra_globals_are_allowed_for_one_load_only(tmp_path):
    path = str(tmp_path / 'timm.pth')
    torch.save({'state_dict': {'w': torch.ones(1)},
                'args': argparse.Namespace(lr=0.1)}, path)
    assert load_checkpoint_file(path)['args'].lr == 0.1
    with pytest.raises(ValueError, match='allow-list'):
        load_checkpoint_safely(path)
    assert weights_only_load(path, extra=[argparse.Namespace])['args'].lr == 0.1


def test_mmengine_loads_local_files_through_mmsoft_on_older_torch():
    loader = CheckpointLoader._get_checkpoint_loader('work_dirs/epoch_1.pth')
    if NATIVE_SAFE_GLOBALS:  # torch >= 2.6 protects mmengine's own
        assert loader is not load_from_local
    else:
        assert loader is load_from_local
