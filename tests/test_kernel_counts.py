"""The kernels a training step launches on a GPU do not grow.

Each case of ``tests/helpers/kernel_counts.py`` (SOFT++-tiny, SOFT++-small
and UFO-ViT-small as their COCO configs build them, and timm's Swin-T, at
batch 2 with the valid regions mmdet passes and at batch 1) counts the
kernels of one training step on the ``meta`` device, the path a GPU runs,
and compares them with the record of its torch release
(``tests/data/kernel_counts.json``). A count is exact: a change that adds
kernels fails here, and one that removes some updates the record
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
    forward, step = case_counts(model, inputs)
    recorded = expected[name]
    assert step <= recorded['step'] and forward <= recorded['forward'], (
        f'{name}: {forward} kernels in forward, {step} in the training step; '
        f'recorded {recorded}')
    assert (forward, step) == (recorded['forward'], recorded['step']), (
        f'{name} launches fewer kernels than recorded ({forward} in forward, {step} '
        f'in the step; recorded {recorded}): update the record with '
        f'`python tests/helpers/kernel_counts.py {RECORD}`')
