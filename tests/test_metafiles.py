"""The model zoo metadata: model-index.yml imports every metafile, each
metafile names configs that exist and build, the papers' numbers are kept
apart from measured results, and OpenMMLab's ``mim`` reads the index.

Backbones are built from the configs (``Config.fromfile``) without their
checkpoint; the whole detectors and segmentors are built in
``tests/test_configs.py``.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import functools
import glob
import importlib.util
import os
import os.path as osp
import subprocess
import sys

import yaml
from mmengine.config import Config
from mmengine.registry import MODELS

import mmsoft  # noqa: F401  (registers the backbones)

pytestmark = pytest.mark.openmmlab

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MIM_INSTALLED = importlib.util.find_spec('mim') is not None


def read_yaml(path: str) -> dict:
    with open(osp.join(REPO, path)) as file:
        return yaml.safe_load(file)


def metafiles():
    return read_yaml('model-index.yml')['Import']


def models():
    """(metafile, model entry) of every model in the zoo."""
    return [(path, model) for path in metafiles()
            for model in read_yaml(path)['Models']]


MODELS_BY_NAME = {model['Name']: model for _, model in models()}


@functools.lru_cache(maxsize=None)
def backbone_cfg(config: str):
    """The backbone settings of ``config`` (parsed once: read, never change)."""
    return Config.fromfile(osp.join(REPO, config)).model.backbone


def test_model_index_imports_every_metafile():
    on_disk = sorted(osp.relpath(path, REPO) for path in
                     glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml')))
    assert sorted(metafiles()) == on_disk


@pytest.mark.parametrize('name', sorted(MODELS_BY_NAME))
def test_config_exists_and_its_backbone_builds(name):
    model = MODELS_BY_NAME[name]
    assert osp.isfile(osp.join(REPO, model['Config'])), model['Config']
    cfg = backbone_cfg(model['Config']).copy()
    cfg.init_cfg = None
    backbone = MODELS.build(cfg)
    size = model['Metadata']['Architecture'][0].rsplit('-', 1)[1]
    assert type(backbone).__name__ == cfg.type
    assert cfg.arch == size


def test_paper_numbers_are_not_results():
    for path in metafiles():
        meta = read_yaml(path)
        for collection in meta['Collections']:
            source = collection['Metadata']['Paper Results Source']
            assert 'not reproduced' in source
        for model in meta['Models']:
            # Nothing has been measured with these configs: no Results at all.
            assert 'Results' not in model, model['Name']
    paper = MODELS_BY_NAME['mask-rcnn_soft++-tiny_fpn_1x_coco']['Metadata'][
        'Paper Results']
    assert paper[0]['Metrics'] == {'box AP': 41.2}
    assert paper[1]['Metrics'] == {'mask AP': 38.2}


@functools.lru_cache(maxsize=None)
def update_tool():
    """``tools/analysis/update_metafiles.py``, the command that writes the
    figures, as a module."""
    spec = importlib.util.spec_from_file_location(
        'update_metafiles', osp.join(REPO, 'tools', 'analysis', 'update_metafiles.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_rows(readme: str) -> dict:
    """Config path to the cells of its row in the table of ``readme``."""
    with open(osp.join(REPO, readme)) as file:
        text = file.read()
    return {config: row for _, config, row in update_tool().table_rows(text, readme)}


def test_figures_are_written_by_the_update_command():
    """Every figure has the form the command writes, and the README tables
    show the metafiles' figures (the counts themselves are checked for a
    subset below, and for every model by ``update_metafiles.py --check``)."""
    tool = update_tool()
    for path in metafiles():
        for collection in read_yaml(path)['Collections']:
            assert tool.COMMAND in collection['Metadata']['FLOPs Source']
    for model in tool.zoo_models(REPO):
        assert isinstance(model.parameters, int), model.name
        assert isinstance(model.flops, int) and model.flops > 1e9, model.name
        assert model.flops == tool.round_flops(model.flops), model.name
        if '_ms-3x_' in model.name:  # the same model as its 1x counterpart
            single = MODELS_BY_NAME[model.name.replace('_ms-3x_', '_1x_')]
            assert model.flops == single['Metadata']['FLOPs'], model.name
            assert model.parameters == single['Metadata']['Parameters'], model.name
        row = readme_rows(model.readme)[model.config]
        written = tool.readme_cells(tool.Figures(model.parameters, 0, model.flops))
        for column in ('Params (ours)', 'GFLOPs*'):
            assert row[column] == written[column], (model.name, column)


# The smallest model of each backbone: about 15 s each on one CPU core.
COUNTED_MODELS = ['mask-rcnn_soft++-tiny_fpn_1x_coco',
                  'mask-rcnn_ufo-vit-tiny_fpn_1x_coco']


@pytest.mark.mmcv_ops  # builds Mask R-CNN
@pytest.mark.parametrize('name', COUNTED_MODELS)
def test_figures_match_get_flops(name):
    """The metafile and README figures are ``get_flops``'s count of the model
    now; on a mismatch, run ``python tools/analysis/update_metafiles.py``."""
    tool = update_tool()
    model, = (m for m in tool.zoo_models(REPO) if m.name == name)
    figures = tool.measure([model.config], REPO)[model.config]
    assert (model.parameters, model.flops) == (figures.parameters, figures.flops)
    row = readme_rows(model.readme)[model.config]
    for column, cell in tool.readme_cells(figures).items():
        assert row[column] == cell, column


@pytest.fixture(scope='module')
def mim_env(tmp_path_factory):
    """The environment as installed (``make install``), run from a scratch
    directory: mim finds mmsoft through the link that
    ``tools/install.sh stack`` puts into site-packages."""
    return dict(os.environ, MIM_CWD=str(tmp_path_factory.mktemp('mim_cwd')))


def run_mim(env, *args):
    """``mim ARGS`` from a scratch directory; returns stdout and stderr."""
    mim = osp.join(osp.dirname(sys.executable), 'mim')
    done = subprocess.run([mim, *args], env=env, cwd=env['MIM_CWD'],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


@pytest.mark.skipif(not MIM_INSTALLED, reason='openmim is not installed '
                    '(requirements/mim.txt)')
def test_mim_search_lists_every_config(mim_env):
    printed = run_mim(mim_env, 'search', 'mmsoft')
    for name in MODELS_BY_NAME:
        assert f'config id: {name}\n' in printed


@pytest.mark.skipif(not MIM_INSTALLED, reason='openmim is not installed '
                    '(requirements/mim.txt)')
@pytest.mark.parametrize('command', [
    ['train', 'mmsoft', 'upernet_soft-tiny_demo.py'],
    ['test', 'mmsoft', 'upernet_soft-tiny_demo.py', '--checkpoint', 'x.pth'],
])
def test_mim_train_and_test_find_config_and_script(mim_env, command):
    # Everything after `--` goes to the script: its help, so nothing runs.
    printed = run_mim(mim_env, *command, '--launcher', 'none', '-y', '--', '-h')
    config = osp.join(REPO, 'configs', 'demo', 'upernet_soft-tiny_demo.py')
    assert f'will use {config} instead' in printed
    script = osp.join('mmsoft', '.mim', 'tools', f'{command[0]}.py')
    assert script in printed
    assert f'usage: {command[0]}.py' in printed
