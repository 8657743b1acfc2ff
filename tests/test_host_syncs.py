"""Host-device synchronisations inside the backbones, counted on the CPU
(:class:`~mmsoft.testing.host_syncs.HostSyncCounter`)."""
from collections import Counter

import pytest
import torch

from mmsoft.testing.host_syncs import HostSyncCounter

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
