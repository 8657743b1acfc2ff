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
    the link that lets mim find the package, see tools/venv.sh)."""
    assert osp.realpath(osp.dirname(mmsoft.__file__)) == osp.join(
        osp.realpath(REPO), 'mmsoft')


def _pinned_torch(requirements: str) -> str:
    """The ``torch==X`` version a requirements file pins."""
    with open(osp.join(REPO, 'requirements', requirements)) as file:
        pins = re.findall(r'^torch==([\d.]+)$', file.read(), re.MULTILINE)
    assert len(pins) == 1, (requirements, pins)
    return pins[0]


def test_supported_torch_range_is_the_tested_one():
    """setup.cfg, the README and the two test environments name one range."""
    from mmsoft.utils.torch_compat import SUPPORTED_TORCH, torch_version
    floor, ceiling = SUPPORTED_TORCH
    assert torch_version(_pinned_torch('floor.txt')) == floor  # make test-floor
    assert torch_version(_pinned_torch('build.txt')) == ceiling  # make test-stack
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    requires = config['options']['install_requires'].split()
    assert f'torch>={floor[0]}.{floor[1]},<{ceiling[0]}.{ceiling[1] + 1}' in requires
    with open(osp.join(REPO, 'README.md')) as file:
        assert (f'**PyTorch {floor[0]}.{floor[1]} to {ceiling[0]}.{ceiling[1]}**'
                in file.read())
