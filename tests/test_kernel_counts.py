"""The kernels a training step launches on a GPU do not grow.

Each case of ``tests/helpers/kernel_counts.py`` (SOFT++-tiny, SOFT++-small
and UFO-ViT-small as their COCO configs build them, and timm's Swin-T and
PVTv2-b2, at batch 2 with the valid regions mmdet passes and at batch 1)
counts the kernels of one training step and of one inference call on the
``meta`` device, the path a GPU runs (each of mmsoft's operations as the
kernels its CUDA implementation launches), and compares them with the
record of its torch release (``tests/data/kernel_counts.json``). A count is
exact: a change that adds kernels fails here, and one that removes some
updates the record
(``python tests/helpers/kernel_counts.py tests/data/kernel_counts.json``).
"""
import json
import os.path as osp

import pytest
import torch

from tests.helpers.kernel_counts import CASES, KernelCounter, case_counts

RECORD = osp.join(osp.dirname(__file__), 'data', 'kernel_counts.json')


def recorded_release() -> dict:
    with open(RECORD) as stream:
        record = json.load(stream)
    release = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
    if release not in record['releases']:
        pytest.skip(f'kernel counts are recorded for torch '
                    f'{sorted(record["releases"])}, not {release}')
    return record['releases'][release]


def test_counter_counts_kernels_not_views():
    x = torch.empty(4, 6, device='meta', requires_grad=True)
    with KernelCounter() as counter:
        y = x.t().reshape(24)  # a view (t), then a copy (clone)
        loss = (y.exp() * y.view(4, 6).flatten()).sum()  # views again
    assert counter.counts == {'clone': 1, 'exp': 1, 'mul': 1, 'sum': 1}
    with counter:
        loss.backward()
    assert counter.total > 4


@pytest.mark.parametrize('case', CASES, ids=[case[0] for case in CASES])
def test_training_step_kernels_do_not_grow(case):
    name, model, inputs = case
    expected = recorded_release()
    if name not in expected:
        pytest.skip(f'{name} is not recorded for this torch release')
    if model.endswith('(timm)'):
        pytest.importorskip('timm')
    counts = case_counts(model, inputs)
    recorded = expected[name]
    assert all(counts[key] <= recorded[key] for key in recorded), (
        f'{name} launches more kernels than recorded: {counts}; recorded {recorded}')
    assert counts == recorded, (
        f'{name} launches fewer kernels than recorded ({counts}; recorded '
        f'{recorded}): update the record with '
        f'`python tests/helpers/kernel_counts.py {RECORD}`')


@pytest.mark.parametrize('model, peer', [('soft++-tiny', 'swin-t (timm)'),
                                         ('ufo-vit-small', 'swin-t (timm)')])
def test_training_steps_launch_at_most_one_and_a_half_times_the_peers(model, peer):
    """The recorded training steps at batch 2 against their yardsticks:
    SOFT++-tiny and UFO-ViT-small within 1.5x Swin-T's kernels, SOFT++-small
    within 2x PVTv2-b2's (``docs/cost.md``)."""
    expected = recorded_release()
    step = expected[f'{model}, batch 2']['step']
    assert step <= 1.5 * expected[f'{peer}, batch 2']['step']
    assert expected['soft++-small, batch 2']['step'] <= \
        2 * expected['pvtv2-b2 (timm), batch 2']['step']
