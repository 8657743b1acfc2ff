"""tools/train.py, tools/test.py and tools/inference_demo.py as modules in
this process, and the checks of mmsoft.apis they run: the errors they report
for bad input (a missing config, data or checkpoint, a config without
mmsoft, options the machine or the config cannot take), ``build_in_scope``,
and the handling of ``--tta``, ``--show`` and the inference options.

The tools' end-to-end runs are in tests/test_tools.py.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import argparse
import copy
import json
import os
import os.path as osp
import re

import numpy as np
import torch
from mmengine.config import Config

from mmsoft import apis
from mmsoft.checkpoint import check_checkpoint_fits, innermost_model
from tests.helpers.tools import load_tool

pytestmark = pytest.mark.openmmlab

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIG = osp.join(REPO, 'configs/demo/mask-rcnn_soft-tiny_fpn_demo.py')
IMPORT_HINT = "add custom_imports = dict(imports=['mmsoft']"
needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                                    reason='the error is for machines without CUDA')


train_tool, test_tool = load_tool('train'), load_tool('test')


def train_config(*argv: str) -> Config:
    """The config tools/train.py sets up for the command line ``argv``."""
    return train_tool.setup_config(train_tool.parse_args(list(argv)))


def config_file(tmp_path, text: str = '') -> str:
    """A plain mmengine config file: ``default_scope`` and ``text``."""
    path = tmp_path / 'name.py'
    path.write_text(f"default_scope = 'mmengine'\n{text}")
    return str(path)


@pytest.fixture(scope='module')
def det_cfg() -> Config:
    """The demo detector's config, parsed once: copy it before changing it."""
    return Config.fromfile(DET_CONFIG)


@pytest.fixture(scope='module')
def detector(det_cfg):
    """The demo detector, built in this process."""
    return apis.build_in_scope('mmdet', det_cfg.model)


# ---------------------------------------------------------------- config ---
def test_missing_config(tmp_path):
    missing = str(tmp_path / 'absent.py')
    for tool in (train_tool, test_tool):
        with pytest.raises(FileNotFoundError, match=re.escape(
                f'config file not found: {missing}')):
            tool.main([missing] if tool is train_tool else [missing, 'c.pth'])


def test_bad_default_scope(tmp_path):
    config = tmp_path / 'mmpretrain.py'
    config.write_text("default_scope = 'mmpretrain'\n")
    with pytest.raises(ValueError, match=re.escape(
            f"config {config} has default_scope='mmpretrain'")):
        train_config(str(config))
    for scope in apis.LIBRARIES:
        assert apis.library_of(Config(dict(default_scope=scope))) == scope


def test_work_dir_precedence(tmp_path):
    path = config_file(tmp_path, "work_dir = 'from_config'\n")
    assert train_config(path).work_dir == 'from_config'
    assert train_config(path, '--work-dir', str(tmp_path)).work_dir == str(tmp_path)
    default = osp.join('./work_dirs', 'name')
    assert train_config(config_file(tmp_path)).work_dir == default


@needs_cpu_only
def test_amp_needs_an_accelerator(tmp_path):
    path = config_file(tmp_path, "optim_wrapper = dict(type='OptimWrapper')\n")
    with pytest.raises(RuntimeError, match='--amp needs a CUDA, NPU or MLU'):
        train_config(path, '--amp')


def test_auto_scale_lr_needs_the_config_key(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            '--auto-scale-lr needs auto_scale_lr = dict(enable=False, '
            'base_batch_size=N)')):
        train_config(config_file(tmp_path), '--auto-scale-lr')
    path = config_file(tmp_path,
                       'auto_scale_lr = dict(enable=False, base_batch_size=16)\n')
    assert train_config(path, '--auto-scale-lr').auto_scale_lr == dict(
        enable=True, base_batch_size=16)


def test_resume_options(tmp_path):
    path = config_file(tmp_path, "load_from = 'init.pth'\n")
    missing = str(tmp_path / 'absent.pth')
    with pytest.raises(FileNotFoundError, match=re.escape(
            f'checkpoint file not found: {missing} (--resume)')):
        train_config(path, '--resume', missing)
    cfg = train_config(path, '--resume')
    assert cfg.resume is True and cfg.load_from is None
    model = torch.nn.Linear(2, 2)
    checkpoint = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    cfg = train_config(path, '--resume', str(checkpoint))
    assert cfg.resume is True and cfg.load_from == str(checkpoint)
    assert apis.check_resumed_checkpoint(cfg, model, path) == str(checkpoint)


def test_resume_auto_finds_the_latest_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    cfg = Config(dict(work_dir=str(tmp_path), resume=True, load_from=None))
    assert apis.check_resumed_checkpoint(cfg, model, 'x.py') is None  # none yet
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'epoch_2.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_2.pth'))
    assert apis.check_resumed_checkpoint(cfg, model, 'x.py') == str(
        tmp_path / 'epoch_2.pth')
    other = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match='does not fit the model of x.py'):
        apis.check_resumed_checkpoint(cfg, other, 'x.py')


# ------------------------------------------------------------ data paths ---
def test_missing_data_root_stops_training_before_the_runner(tmp_path):
    missing = str(tmp_path / 'nowhere')
    work_dir = str(tmp_path / 'work')
    with pytest.raises(FileNotFoundError) as error:
        train_tool.main([DET_CONFIG, '--work-dir', work_dir, '--cfg-options',
                         f'train_dataloader.dataset.data_root={missing}'])
    message = str(error.value)
    assert f'data root not found: {missing}' in message
    assert 'tools/generate_demo_data.py' in message
    assert not osp.exists(work_dir)  # the runner, which creates it, was not built


def test_missing_annotation_file_stops_testing(small_coco, tmp_path):
    ann = str(tmp_path / 'no_such.json')
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f'annotation file not found: {ann}')):
        test_tool.main([DET_CONFIG, str(tmp_path / 'x.pth'), '--work-dir',
                        str(tmp_path), '--cfg-options',
                        f'test_dataloader.dataset.data_root={small_coco}',
                        f'test_dataloader.dataset.ann_file={ann}'])


def test_missing_checkpoint_stops_testing(small_coco, tmp_path):
    missing = str(tmp_path / 'x.pth')
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f'checkpoint file not found: {missing}')):
        test_tool.main([DET_CONFIG, missing, '--work-dir', str(tmp_path),
                        '--cfg-options',
                        f'test_dataloader.dataset.data_root={small_coco}'])


def test_missing_image_folder_in_a_wrapped_dataset(tmp_path):
    (tmp_path / 'train.json').write_text('{}')
    (tmp_path / 'images').mkdir()
    good = dict(data_root=str(tmp_path), ann_file='train.json',
                data_prefix=dict(img='images/'))
    bad = dict(good, data_prefix=dict(img='missing/', seg=None))
    cfg = Config(dict(train_dataloader=dict(dataset=dict(
        type='RepeatDataset', times=2,
        dataset=dict(type='ConcatDataset', datasets=[good, bad])))))
    missing = osp.join(str(tmp_path), 'missing/')
    with pytest.raises(FileNotFoundError, match=re.escape(
            f'data folder not found: {missing} (train_dataloader.dataset.dataset.'
            f'datasets[1].data_prefix.img in demo.py)')):
        apis.check_dataset_paths(cfg, ('train', ), 'demo.py')
    apis.check_dataset_paths(cfg, ('val', ), 'demo.py')  # no val_dataloader
    cfg.train_dataloader.dataset.dataset.datasets[1] = dict(
        bad, data_prefix=dict(img='s3://bucket/images/'))  # remote: not checked
    apis.check_dataset_paths(cfg, ('train', ), 'demo.py')


# ---------------------------------------------------------------- runner ---
def test_config_without_mmsoft_import(tmp_path):
    config = tmp_path / 'no_import.py'
    config.write_text(f"_base_ = ['{DET_CONFIG}']\ncustom_imports = None\n")
    cfg = Config.fromfile(str(config))
    with pytest.raises(KeyError) as error:
        apis.build_runner(cfg, str(config))
    message = error.value.args[0]
    assert 'SOFT is not in the mmdet::model registry' in message
    assert IMPORT_HINT in message and str(config) in message


def test_registry_miss_gets_the_import_hint(tmp_path):
    cfg = Config(dict(default_scope='mmengine', model=dict(type='NoSuchModel'),
                      work_dir=str(tmp_path)))
    with pytest.raises(KeyError) as error:
        apis.build_runner(cfg, 'plugin.py')
    message = error.value.args[0]
    assert 'NoSuchModel is not in the mmengine::model registry' in message
    assert ('Hint: if NoSuchModel comes from mmsoft or another plugin, '
            f'{IMPORT_HINT}') in message
    assert 'the config plugin.py (custom_imports: none)' in message


@pytest.mark.mmcv_ops  # builds an mmdet model (mmcv._ext)
def test_build_in_scope_uses_the_scope_registry(det_cfg, detector):
    from mmdet.models.detectors import MaskRCNN
    from mmdet.models.backbones import ResNet as DetResNet
    from mmseg.models.backbones import ResNet as SegResNet
    from mmsoft.openmmlab import SOFT
    assert type(detector) is MaskRCNN and type(detector.backbone) is SOFT
    resnet = dict(type='ResNet', depth=18)
    assert type(apis.build_in_scope('mmdet', resnet)) is DetResNet
    assert type(apis.build_in_scope('mmseg', resnet)) is SegResNet
    with pytest.raises(ValueError, match=re.escape(
            "scope='mmpretrain' is not supported; expected one of")):
        apis.build_in_scope('mmpretrain', resnet)


@pytest.mark.mmcv_ops  # builds an mmdet model (mmcv._ext)
def test_build_in_scope_without_pretrained_weights(det_cfg, tmp_path):
    pretrained = dict(type='Pretrained', checkpoint=str(tmp_path / 'absent.pth'))
    model_cfg = copy.deepcopy(det_cfg.model)
    model_cfg.backbone.init_cfg = pretrained
    model = apis.build_in_scope('mmdet', model_cfg, pretrained=False)
    assert model.backbone.init_cfg is None
    assert model_cfg.backbone.init_cfg == pretrained  # not changed
    kept = apis.build_in_scope('mmdet', model_cfg)
    assert kept.backbone.init_cfg == pretrained


# ----------------------------------------------------------- distributed ---
@needs_cpu_only
def test_cpu_launchers():
    with pytest.raises(RuntimeError, match=re.escape(
            '--launcher slurm needs CUDA devices; on CPU use torchrun')):
        apis.setup_cpu_distributed(Config(dict(launcher='slurm')))
    cfg = Config(dict(launcher='none'))
    apis.setup_cpu_distributed(cfg)
    assert 'model_wrapper_cfg' not in cfg


def test_launcher_options_export_local_rank(monkeypatch):
    for tool, argv in ((train_tool, ['c.py']), (test_tool, ['c.py', 'c.pth'])):
        monkeypatch.delenv('LOCAL_RANK', raising=False)
        args = tool.parse_args(argv + ['--launcher', 'pytorch', '--local-rank', '3'])
        assert args.launcher == 'pytorch' and os.environ['LOCAL_RANK'] == '3'


# ----------------------------------------------------------- checkpoints ---
@pytest.mark.mmcv_ops  # builds an mmdet model (mmcv._ext)
def test_truncated_checkpoint(detector, tmp_path):
    whole = tmp_path / 'whole.pth'
    torch.save({'state_dict': detector.state_dict()}, whole)
    truncated = tmp_path / 'truncated.pth'
    data = whole.read_bytes()
    truncated.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=re.escape(
            f'checkpoint file {truncated} could not be read; it is truncated')):
        check_checkpoint_fits(str(truncated), detector, 'demo.py')


@pytest.mark.mmcv_ops  # builds an mmdet model (mmcv._ext)
def test_foreign_checkpoints(detector, tmp_path):
    other = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7),
                               'fc.weight': torch.zeros(10, 2048)}}, other)
    with pytest.raises(ValueError, match=re.escape(
            f'checkpoint file {other} does not fit the model of demo.py: only 0 of')):
        check_checkpoint_fits(str(other), detector, 'demo.py')

    class Payload:
        def __reduce__(self):
            return (os.system, ('echo unsafe',))

    unsafe = tmp_path / 'unsafe.pth'
    torch.save({'state_dict': Payload()}, unsafe)
    with pytest.raises(ValueError, match=re.escape(
            f'checkpoint file {unsafe} contains objects outside the allow-list')):
        check_checkpoint_fits(str(unsafe), detector, 'demo.py')

    text = tmp_path / 'notes.pth'
    text.write_text(json.dumps({'not': 'a checkpoint'}))
    with pytest.raises(ValueError, match=re.escape(f'checkpoint file {text}')):
        check_checkpoint_fits(str(text), detector, 'demo.py')
    with pytest.raises(FileNotFoundError, match='checkpoint file not found'):
        check_checkpoint_fits(str(tmp_path / 'absent.pth'), detector, 'demo.py')

    own = tmp_path / 'own.pth'
    torch.save({'state_dict': detector.state_dict()}, own)
    check_checkpoint_fits(str(own), detector, 'demo.py')  # fits: no error


# ------------------------------------------------ --tta, --show, inference ---
SEG_CONFIG = osp.join(REPO, 'configs/demo/upernet_soft-tiny_demo.py')


@pytest.fixture
def agg_backend():
    """matplotlib's non-interactive ``agg`` backend (a machine without a
    display), the previous backend restored after the test."""
    import matplotlib
    previous = matplotlib.get_backend()
    matplotlib.use('agg')
    yield
    matplotlib.use(previous)


def test_test_tool_parses_tta_show_and_wait_time():
    parse_args = test_tool.parse_args
    args = parse_args(['c.py', 'c.pth'])
    assert (args.tta, args.show, args.wait_time) == (False, False, 2.0)
    args = parse_args(['c.py', 'c.pth', '--tta', '--show', '--wait-time', '0.5'])
    assert (args.tta, args.show, args.wait_time) == (True, True, 0.5)


def test_tta_of_mmseg_uses_the_config_tta():
    cfg = Config.fromfile(SEG_CONFIG)
    model, tta_pipeline = copy.deepcopy(cfg.model), copy.deepcopy(cfg.tta_pipeline)
    test_tool.enable_tta(cfg, SEG_CONFIG)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module == model
    assert cfg.test_dataloader.dataset.pipeline == tta_pipeline
    views = cfg.test_dataloader.dataset.pipeline[1]['transforms']
    assert [len(step) for step in views[:2]] == [6, 2]  # 6 scales x 2 flips
    for key in ('tta_model', 'tta_pipeline'):
        cfg = Config.fromfile(SEG_CONFIG)
        cfg.pop(key)
        with pytest.raises(ValueError, match=re.escape(
                f'--tta needs {key} in the config {SEG_CONFIG}')):
            test_tool.enable_tta(cfg, SEG_CONFIG)
    with pytest.raises(ValueError, match=re.escape(
            "--tta is for mmdet and mmseg configs; x.py has default_scope='mmengine'")):
        test_tool.enable_tta(Config(dict(default_scope='mmengine')), 'x.py')


def test_tta_of_mmdet_defaults_to_flips(det_cfg):
    cfg = copy.deepcopy(det_cfg)
    with pytest.raises(ValueError, match=re.escape(
            "--tta: mmdet's DetTTAModel merges boxes only and the model of "
            f'{DET_CONFIG} predicts masks (model.roi_head.mask_head)')):
        test_tool.enable_tta(cfg, DET_CONFIG)
    cfg = copy.deepcopy(det_cfg)
    cfg.model.roi_head.mask_head = None
    model, test_pipeline = copy.deepcopy(cfg.model), copy.deepcopy(
        cfg.test_dataloader.dataset.pipeline)
    with pytest.warns(UserWarning, match='Cannot find ``tta_'):
        test_tool.enable_tta(cfg, DET_CONFIG)
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module == model
    assert cfg.model.tta_cfg == dict(nms=dict(type='nms', iou_threshold=0.5),
                                     max_per_img=100)
    pipeline = cfg.test_dataloader.dataset.pipeline
    assert pipeline[:-1] == test_pipeline[:-1]
    flips, pack = pipeline[-1]['transforms']
    assert [flip['prob'] for flip in flips] == [1.0, 0.0]
    assert pack[0]['type'] == 'PackDetInputs'
    assert {'flip', 'flip_direction'} <= set(pack[0]['meta_keys'])


@pytest.mark.mmcv_ops  # builds an mmdet model (mmcv._ext)
def test_tta_model_is_unwrapped_for_the_checkpoint_check(detector, tmp_path):
    from mmdet.models import DetTTAModel
    checkpoint = tmp_path / 'own.pth'
    torch.save({'state_dict': detector.state_dict()}, checkpoint)
    wrapped = DetTTAModel(module=detector)
    assert innermost_model(wrapped) is detector
    check_checkpoint_fits(str(checkpoint), wrapped, 'demo.py')


def test_show_sets_the_visualization_hook(agg_backend, tmp_path):
    args = test_tool.parse_args([SEG_CONFIG, 'c.pth', '--work-dir', str(tmp_path),
                                 '--show', '--wait-time', '0.5', '--show-dir',
                                 str(tmp_path / 'painted'), '--tta'])
    with pytest.warns(UserWarning, match=re.escape(
            "--show: matplotlib's backend 'agg' cannot open windows")):
        cfg = test_tool.setup_config(args)
    hook = cfg.default_hooks.visualization
    assert (hook.draw, hook.interval, hook.show, hook.wait_time) == (
        True, 1, True, 0.5)
    assert cfg.visualizer.save_dir == str(tmp_path / 'painted')
    assert cfg.model.type == 'SegTTAModel' and cfg.load_from == 'c.pth'


def test_show_wait_time_errors(agg_backend):
    with pytest.raises(ValueError, match=re.escape(
            '--wait-time must be >= 0 seconds (0: wait for a key press), got -1')):
        apis.check_show(-1)
    with pytest.raises(ValueError, match=re.escape(
            "--show --wait-time 0 waits for a key press in a window, but "
            "matplotlib's backend 'agg' opens none")):
        apis.check_show(0)
    with pytest.raises(ValueError, match=re.escape(
            '--show needs default_hooks.visualization')):
        test_tool.trigger_visualization_hook(
            Config(dict(default_hooks=dict())),
            argparse.Namespace(show=True, show_dir=None, wait_time=2.0))


def test_inference_options():
    inference = load_tool('inference_demo')
    with pytest.raises(ValueError, match=re.escape(
            "inference takes mmdet or mmseg configs, got default_scope='mmengine'")):
        inference.paint_options('mmengine', None)
    assert inference.paint_options('mmdet', None) == dict(pred_score_thr=0.3)
    assert inference.paint_options('mmdet', 0.0) == dict(pred_score_thr=0.0)
    with pytest.raises(ValueError, match=re.escape(
            'score_thr must be in [0, 1], got 1.5')):
        inference.paint_options('mmdet', 1.5)
    with pytest.raises(ValueError, match=re.escape(
            'score_thr=0.5 is for detectors')):
        inference.paint_options('mmseg', 0.5)
    assert inference.describe_prediction(
        dict(scores=[0.9, 0.2, 0.5])) == '2 of 3 instances'
    assert inference.describe_prediction(np.array([[3, 0], [0, 1]])) == \
        'classes [0, 1, 3]'


@pytest.mark.mmcv_ops  # mmdet.apis, a detector
def test_inference_of_a_config_without_mmsoft(tmp_path):
    config = tmp_path / 'no_import.py'
    config.write_text(f"_base_ = ['{DET_CONFIG}']\ncustom_imports = None\n")
    with pytest.raises(KeyError, match=re.escape(
            'is not in the mmdet::model registry unless mmsoft is imported')):
        load_tool('inference_demo').paint_predictions(str(config), 'c.pth', 'x.png',
                                                      'y.png')
