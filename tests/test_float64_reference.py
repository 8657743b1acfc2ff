"""The backbones compute the same function as commit 59b7304, in float64.

For every case of ``tests/helpers/float64_reference.py`` (each SOFT and
SOFT++ size, the solvers, the chunked, plain and valid-region paths, each
UFO-ViT size), the projections of the four maps, the images' gradient and
the parameters' gradients equal those 59b7304 gave with the same weights and
images, to 1e-10 relative. 59b7304's projections are recorded for the torch
release of each test environment (``tests/data/float64_reference_59b7304.json``).
"""
import json
import os.path as osp

import pytest
import torch

from tests.helpers.float64_reference import CASES, case_projections

RECORD = osp.join(osp.dirname(__file__), 'data', 'float64_reference_59b7304.json')
RELATIVE = 1e-10


def recorded_release():
    with open(RECORD) as stream:
        record = json.load(stream)
    version = torch.__version__.split('+')[0]
    if version not in record['releases']:
        pytest.skip(f'59b7304 is recorded for torch {sorted(record["releases"])}, '
                    f'not {version}')
    return record['releases'][version]


def test_every_case_is_recorded():
    with open(RECORD) as stream:
        record = json.load(stream)
    for version, cases in record['releases'].items():
        assert sorted(cases) == sorted(case[0] for case in CASES), version


@pytest.mark.parametrize('case', CASES, ids=[case[0] for case in CASES])
def test_outputs_and_gradients_equal_59b7304(case):
    expected = recorded_release()[case[0]]
    torch.manual_seed(0)
    got = case_projections(case)
    assert sorted(got) == sorted(expected)
    for key, values in expected.items():
        scale = max(abs(value) for value in values)
        for mine, theirs in zip(got[key], values):
            assert abs(mine - theirs) <= RELATIVE * scale, (key, got[key], values)
