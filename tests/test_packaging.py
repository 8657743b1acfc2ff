"""What the installed package exposes to OpenMMLab tooling."""
import os.path as osp

import yaml

import mmsoft

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
