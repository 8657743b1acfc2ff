"""What the installed package exposes to OpenMMLab tooling."""
import configparser
import os.path as osp
import re

import yaml

import mmsoft

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MIM_DIR = osp.join(osp.dirname(mmsoft.__file__), '.mim')


def test_mim_index_lists_existing_configs():
    with open(osp.join(MIM_DIR, 'model-index.yml')) as file:
        index = yaml.safe_load(file)
    configs = []
    for metafile in index['Import']:
        with open(osp.join(MIM_DIR, metafile)) as file:
            configs += [model['Config'] for model in yaml.safe_load(file)['Models']]
    assert len(configs) == 20
    assert all(osp.isfile(osp.join(MIM_DIR, path)) for path in configs)


def test_imported_package_is_the_checkout():
    """An editable install imports the working tree's files (in .venv through
    the link that lets mim find the package, see tools/install_common.sh)."""
    assert osp.realpath(osp.dirname(mmsoft.__file__)) == osp.join(
        osp.realpath(REPO), 'mmsoft')


def _pinned_torch(requirements: str) -> str:
    """The ``torch==X`` version a requirements file pins."""
    with open(osp.join(REPO, 'requirements', requirements)) as file:
        pins = re.findall(r'^torch==([\d.]+)$', file.read(), re.MULTILINE)
    assert len(pins) == 1, (requirements, pins)
    return pins[0]


def test_supported_torch_range_is_the_tested_one():
    """setup.cfg's floor, the README and the two test environments name one
    range; setup.cfg sets no ceiling (installing mmsoft never swaps a user's
    newer torch)."""
    from mmsoft.utils.torch_compat import SUPPORTED_TORCH, torch_version
    floor, ceiling = SUPPORTED_TORCH
    assert torch_version(_pinned_torch('floor.txt')) == floor  # make test-floor
    assert torch_version(_pinned_torch('build.txt')) == ceiling  # make test-stack
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    requires = config['options']['install_requires'].split()
    assert f'torch>={floor[0]}.{floor[1]}' in requires
    assert not any(r.startswith('torch') and '<' in r for r in requires), requires
    with open(osp.join(REPO, 'README.md')) as file:
        assert (f'**PyTorch {floor[0]}.{floor[1]} to {ceiling[0]}.{ceiling[1]}**'
                in file.read())


def test_untested_torch_warns_once_and_tested_ones_do_not():
    import warnings

    from mmsoft.utils.torch_compat import (SUPPORTED_TORCH, UntestedTorchWarning,
                                           warn_if_untested_torch)
    floor, ceiling = SUPPORTED_TORCH
    for inside in (f'{floor[0]}.{floor[1]}.2', f'{ceiling[0]}.{ceiling[1]}.1+cu130'):
        assert not warn_if_untested_torch(inside)
    newer = f'{ceiling[0]}.{ceiling[1] + 1}.0'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('default')  # Python's own rule: once per line
        for _ in range(3):
            warn_if_untested_torch(newer)
    assert len(caught) == 1
    assert caught[0].category is UntestedTorchWarning
    assert newer in str(caught[0].message)
    assert f'{ceiling[0]}.{ceiling[1]}' in str(caught[0].message)
    with warnings.catch_warnings(record=True):
        assert warn_if_untested_torch('2.0.1')
