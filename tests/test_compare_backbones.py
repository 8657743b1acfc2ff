"""The side-by-side comparison: its configs, schedules, metrics, report and tool.

``tools/analysis/compare_backbones.py`` trains the backbones of
:mod:`mmsoft_analysis.comparison` with one Mask R-CNN (one UperNet): every
config must be the demo config with only the backbone and the input widths
of the neck (heads) changed, and every peer must be a library's class.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

from mmengine.config import Config

from mmsoft_analysis.comparison import (BBOX_METRIC, DETECTORS, GROUP_PARAMS,
                                        MIOU_METRIC, PROBE_CONTROL,
                                        PROBE_DETECTORS, RECIPES, SEGM_METRIC,
                                        SEGMENTORS,
                                        detection_schedule, epoch_loss,
                                        PLAIN, PROBE_OPTIONS, comparison_rows,
                                        final_metrics, measure_costs,
                                        probe_jobs, recipe_options,
                                        seed_summary, segmentation_schedule,
                                        write_report)
from tests.helpers.tools import load_tool

pytestmark = pytest.mark.openmmlab

REPO = Path(__file__).resolve().parents[1]
DEMO_DETECTOR = 'configs/demo/mask-rcnn_soft-tiny_fpn_demo.py'
DEMO_SEGMENTOR = 'configs/demo/upernet_soft-tiny_demo.py'
TIMM_CONFIGS = ('pvtv2-b2-li', 'xcit-t12')
LIBRARIES = ('mmsoft', 'mmdet', 'mmseg', 'mmpretrain')
# The comparison's own wrapper around a library's trunk (XCiT's resampling).
PEER_WRAPPERS = 'configs.comparison.peer_backbones'


def _resolved(path: str) -> dict:
    return Config.fromfile(str(REPO / path)).to_dict()


def _without(cfg: dict, *keys: str) -> dict:
    """``cfg`` with the dotted ``keys`` removed (and custom_imports)."""
    cfg = json.loads(json.dumps(cfg, default=str))
    cfg.pop('custom_imports', None)
    for key in keys:
        *parents, leaf = key.split('.')
        node = cfg
        for parent in parents:
            node = node[parent]
        node.pop(leaf)
    return cfg


def _marks(entry):
    needs_timm = any(name in entry.config for name in TIMM_CONFIGS)
    return [pytest.mark.torchvision] if needs_timm else []


@pytest.mark.parametrize('entry', [pytest.param(e, id=e.name) for e in DETECTORS])
def test_detector_differs_from_the_demo_only_in_backbone(entry):
    changed = ('backbone_dims', 'model.backbone', 'model.neck.in_channels')
    assert _without(_resolved(entry.config), *changed) == _without(
        _resolved(DEMO_DETECTOR), *changed)


@pytest.mark.parametrize('entry', [pytest.param(e, id=e.name) for e in SEGMENTORS])
def test_segmentor_differs_from_the_demo_only_in_backbone(entry):
    changed = ('backbone_dims', 'model.backbone', 'model.decode_head.in_channels',
               'model.auxiliary_head.in_channels')
    assert _without(_resolved(entry.config), *changed) == _without(
        _resolved(DEMO_SEGMENTOR), *changed)


@pytest.mark.mmcv_ops  # builds mmdet and mmseg backbones from their configs
@pytest.mark.parametrize('entry', [
    pytest.param(e, id=f'{e.name}-{Path(e.config).stem[:4]}', marks=_marks(e))
    for e in DETECTORS + SEGMENTORS])
def test_backbone_is_the_libraries_class_in_its_group(entry):
    from mmsoft_analysis.models import config_backbone
    backbone = config_backbone(str(REPO / entry.config))
    modules = [type(backbone).__module__]
    if hasattr(backbone, 'trunk'):  # XCiT: timm's trunk, resampled
        modules.append(type(backbone.trunk).__module__)
    if hasattr(getattr(backbone, 'trunk', backbone), 'timm_model'):
        modules.append(type(getattr(backbone, 'trunk', backbone).timm_model).__module__)
        assert modules[-1].startswith('timm.'), modules
        assert entry.source == 'timm'
    else:
        assert modules[0].split('.')[0] == entry.source, modules
    assert all(m == PEER_WRAPPERS or m.split('.')[0] in LIBRARIES + ('timm', )
               for m in modules), modules
    low, high = GROUP_PARAMS[entry.group]
    params = sum(p.numel() for p in backbone.parameters())
    assert low <= params <= high, (entry.name, params)


STRIDES = (4, 8, 16, 32)


def input_channels(entry) -> list:
    """The widths the neck (or the heads) of ``entry``'s config expect."""
    model = _resolved(entry.config)['model']
    head = model.get('neck') or model['decode_head']
    return list(head['in_channels'])


def pyramid_errors(outputs, channels, height: int, width: int) -> list:
    """What is wrong with ``outputs`` as the four maps at strides 4-32 of one
    ``height`` x ``width`` image with ``channels`` channels (empty: right)."""
    errors = [] if len(outputs) == len(STRIDES) else [
        f'{len(outputs)} maps, expected {len(STRIDES)}']
    for level, (out, stride, width_c) in enumerate(zip(outputs, STRIDES, channels)):
        expected = (1, width_c, height // stride, width // stride)
        if tuple(out.shape) != expected:
            errors.append(f'level {level}: {tuple(out.shape)}, expected {expected} '
                          f'(stride {stride})')
    return errors


@pytest.mark.mmcv_ops  # builds mmdet and mmseg backbones from their configs
@pytest.mark.parametrize('entry', [
    pytest.param(e, id=f'{e.name}-{Path(e.config).stem[:4]}', marks=_marks(e))
    for e in DETECTORS + SEGMENTORS + [PROBE_CONTROL]])
def test_backbone_gives_strides_4_to_32_at_the_heads_widths(entry):
    """One 160x224 image (the demo's 160 and a second size, so that height
    and width cannot be swapped) through the backbone as its config builds
    it: four maps at strides 4, 8, 16 and 32 with the neck's (heads')
    input widths."""
    import torch
    from mmsoft_analysis.models import config_backbone
    torch.manual_seed(0)
    backbone = config_backbone(str(REPO / entry.config))
    backbone.eval()  # some backbones' train() returns None
    with torch.no_grad():
        outputs = backbone(torch.randn(1, 3, 160, 224))
    assert pyramid_errors(outputs, input_channels(entry), 160, 224) == []


@pytest.mark.mmcv_ops
@pytest.mark.parametrize('settings, error', [
    (dict(strides=(1, 2, 2, 1)), 'level 3: (1, 512, 10, 14), expected (1, 512, 5, 7)'),
    (dict(out_indices=(1, 2, 3)), '3 maps, expected 4')])
def test_stride_check_fails_on_a_wrong_stride(settings, error):
    """The check above rejects ResNet-18 with its last stage's stride 1
    (stride 16 where 32 is expected) and with a level left out."""
    import torch
    from mmdet.models.backbones import ResNet
    backbone = ResNet(depth=18, **settings)
    backbone.eval()
    with torch.no_grad():
        outputs = backbone(torch.randn(1, 3, 160, 224))
    assert error in ' '.join(pyramid_errors(outputs, [64, 128, 256, 512], 160, 224))


def test_config_specs_take_backbone_options():
    """``config.py:key=value`` builds the config's backbone with the option
    set: how the costs measure mmsoft's backbones without the
    memory-efficient path."""
    from mmsoft_analysis.models import parse_spec
    spec = parse_spec(f'{DEMO_DETECTOR}{PLAIN}')
    assert (spec.name, spec.kwargs) == (DEMO_DETECTOR, dict(memory_efficient=False))
    with pytest.raises(ValueError, match="config 'missing.py'"):
        parse_spec('missing.py:memory_efficient=False')


@pytest.mark.mmcv_ops
def test_config_backbone_applies_the_options():
    from mmsoft_analysis.models import build_backbone
    for spec, expected in ((DEMO_DETECTOR, True), (DEMO_DETECTOR + PLAIN, False)):
        backbone = build_backbone(spec)
        switches = {module.memory_efficient for module in backbone.modules()
                    if hasattr(module, 'memory_efficient')}
        assert switches == {expected}, spec


def test_detection_schedule_keeps_the_warmup_share():
    options = dict(option.split('=') for option in detection_schedule(3))
    # The demo warms up for 100 of 8 x 75 iterations; 3 epochs keep 3/8 of it.
    assert options == {
        'train_cfg.max_epochs': '3', 'train_cfg.val_interval': '3',
        'param_scheduler.0.end': '38', 'param_scheduler.1.end': '3',
        'param_scheduler.1.T_max': '3', 'default_hooks.checkpoint.max_keep_ckpts': '1'}
    assert dict(o.split('=') for o in detection_schedule(8))[
        'param_scheduler.0.end'] == '100'


def test_segmentation_schedule_keeps_the_warmup_share():
    options = dict(option.split('=') for option in segmentation_schedule(300))
    assert options['param_scheduler.0.end'] == '14'  # ceil(50 * 300 / 1100)
    assert options['param_scheduler.1.begin'] == '14'
    assert options['param_scheduler.1.end'] == '300'
    assert options['train_cfg.val_interval'] == '300'


@pytest.mark.parametrize('call, argument', [
    (lambda: detection_schedule(0), 'epochs'),
    (lambda: detection_schedule(9), 'epochs'),
    (lambda: segmentation_schedule(1101), 'iters')])
def test_schedules_outside_the_demo_are_refused(call, argument):
    with pytest.raises(ValueError, match=f'{argument} must be between 1 and'):
        call()


def test_final_metrics_reads_the_newest_validation(tmp_path):
    old = tmp_path / '20260101_000000' / 'vis_data'
    new = tmp_path / '20260102_000000' / 'vis_data'
    for folder in (old, new):
        folder.mkdir(parents=True)
    (old / 'scalars.json').write_text(json.dumps({'mIoU': 10.0, 'step': 5}) + '\n')
    (new / 'scalars.json').write_text('\n'.join([
        json.dumps({'loss': 1.0, 'step': 1}),
        json.dumps({'mIoU': 20.0, 'aAcc': 90.0, 'step': 10}),
        json.dumps({'loss': 0.5, 'step': 11})]) + '\n')
    assert final_metrics(tmp_path, ['mIoU']) == {'mIoU': 20.0, 'step': 10}
    assert final_metrics(tmp_path, [BBOX_METRIC]) is None


def test_recipes_set_the_learning_rate_and_a_warmup_in_epochs():
    assert recipe_options('shared', 3) == []
    assert recipe_options('warmup-1-epoch', 3) == ['param_scheduler.0.end=75']
    assert recipe_options('lr-3e-4-warmup-1-epoch', 3) == [
        'optim_wrapper.optimizer.lr=0.0003', 'param_scheduler.0.end=75']
    with pytest.raises(ValueError, match="recipe 'lr-1' is not known"):
        recipe_options('lr-1', 3)
    # Later options win in mmengine's --cfg-options: the recipe's warm-up
    # replaces the schedule's, and the probe stops after the first epoch.
    options = dict(o.split('=') for o in [*detection_schedule(3),
                                          *recipe_options('warmup-1-epoch', 3),
                                          *PROBE_OPTIONS])
    assert options['param_scheduler.0.end'] == '75'
    assert options['param_scheduler.1.T_max'] == '3'
    assert options['train_cfg.max_epochs'] == '1'


def test_probe_covers_every_recipe_and_the_control(tmp_path):
    """The failed backbones and the control under every recipe: the first
    epoch, then the full run after it, in the same work dir."""
    class Args:
        seeds, epochs, cfg_options, work_dir = [0, 1], 3, [], tmp_path

    jobs = probe_jobs(Args)
    first = [job for job in jobs if job['task'] == 'probe']
    full = [job for job in jobs if job['task'] == 'detection']
    expected = {(entry.name, recipe) for entry in PROBE_DETECTORS
                for recipe in RECIPES}
    assert {(job['entry'].name, job['entry'].recipe) for job in first} == expected
    assert {(job['entry'].name, job['entry'].recipe) for job in full} == expected
    assert len(jobs) == 2 * len(expected)
    assert [entry.name for entry in PROBE_DETECTORS] == [
        'Swin (64 channels, window 5)', 'PVTv2-b2-li', 'PVTv2-b2 (control)']
    by_key = {job['key']: job for job in jobs}
    for job in full:
        before = by_key[job['after']]
        assert jobs.index(before) < jobs.index(job)
        assert before['work_dir'] == job['work_dir'] and job['seed'] == 0
        assert 'train_cfg.max_epochs=1' in before['command']
        assert 'train_cfg.max_epochs=1' not in job['command']
    assert all(entry.recipe in RECIPES for entry in DETECTORS + SEGMENTORS)


def _write_scalars(folder, records):
    folder.mkdir(parents=True)
    (folder / 'scalars.json').write_text(
        '\n'.join(json.dumps(record) for record in records) + '\n')


def test_first_epoch_metrics_and_loss_survive_the_resumed_run(tmp_path):
    """The probe's epoch-1 figures are read back after the full run has
    resumed in the same work dir (a newer timestamp)."""
    _write_scalars(tmp_path / '20260101_000000' / 'vis_data', [
        *[dict(loss=4.0 - step / 50, step=step) for step in range(10, 80, 10)],
        {BBOX_METRIC: 0.01, SEGM_METRIC: 0.02, 'step': 1}])
    _write_scalars(tmp_path / '20260102_000000' / 'vis_data', [
        dict(loss=0.5, step=150), {BBOX_METRIC: 0.2, SEGM_METRIC: 0.1, 'step': 3}])
    keys = [BBOX_METRIC, SEGM_METRIC]
    assert final_metrics(tmp_path, keys, step=1) == {BBOX_METRIC: 0.01,
                                                     SEGM_METRIC: 0.02, 'step': 1}
    assert final_metrics(tmp_path, keys)[BBOX_METRIC] == 0.2
    # Iterations 50, 60 and 70 are the last 40% of a 75-iteration epoch.
    assert epoch_loss(tmp_path, 75) == pytest.approx(4.0 - 60 / 50)
    assert epoch_loss(tmp_path / 'missing', 75) is None


def test_seed_summary():
    assert seed_summary([0.3, 0.1]) == dict(mean=pytest.approx(0.2), low=0.1,
                                            high=0.3, values=[0.3, 0.1])


def _run(entry, task, seed, metrics):
    return dict(task=task, name=entry.name, config=entry.config, seed=seed,
                wall_seconds=600.0 + seed * 60, returncode=0, metrics=metrics)


def _costs(entries):
    def rows(**columns):
        return [dict(label=e.config, status='ok',
                     **{k: v + i for k, v in columns.items()})
                for i, e in enumerate(entries)]
    plain = [dict(label=e.config + PLAIN, status='ok', cpu_ms=7000.,
                  live_peak_mib=102.) for e in entries if e.ours]
    return dict(inference=rows(params_m=3., gflops=10., cpu_ms=1000.),
                flops=rows(gflops=0.5), train=rows(cpu_ms=5000.) + plain,
                peak=rows(live_peak_mib=100.) + plain)


SETTINGS = dict(epochs=3, seg_iters=300, seeds=[0, 1], threads=1, jobs=2,
                sizes=dict(inference='800x1333', flops='160x160', train='800x1333',
                           peak='1536x1536'),
                machine=dict(processor='x86_64', cpu_count=2, torch='2.x',
                             date='2026-12-01'))


def test_report_rows_join_seeds_and_costs():
    detector, missing = DETECTORS[0], DETECTORS[1]
    runs = [_run(detector, 'detection', 0, {BBOX_METRIC: 0.30, SEGM_METRIC: 0.2}),
            _run(detector, 'detection', 1, {BBOX_METRIC: 0.20, SEGM_METRIC: 0.1}),
            _run(SEGMENTORS[0], 'segmentation', 0, {MIOU_METRIC: 40.0})]
    rows = comparison_rows(runs, _costs([detector, missing]), [detector, missing],
                           SEGMENTORS[:1])
    first, second = rows['detection']
    # mmsoft's rows read the plain-autograd figures from their own spec, the
    # peers' repeat theirs.
    assert (first['train_iter_s_plain'], first['train_peak_mib_plain']) == (7.0, 102.0)
    assert first['gflops_small'] == 0.5
    assert first[BBOX_METRIC] == dict(mean=pytest.approx(0.25), low=0.2, high=0.3,
                                      values=[0.3, 0.2])
    assert first['seeds'] == [0, 1] and first['train_minutes'] == pytest.approx(10.5)
    assert (first['params_m'], first['gflops'], first['latency_s'],
            first['train_iter_s'], first['train_peak_mib']) == (3.0, 10.0, 1.0, 5.0,
                                                                100.0)
    assert second[BBOX_METRIC] is None and second['latency_s'] == 1.001
    assert rows['segmentation'][0][MIOU_METRIC]['values'] == [40.0]


def test_report_writes_table_and_plots(tmp_path):
    detector = DETECTORS[0]
    runs = [_run(detector, 'detection', s, {BBOX_METRIC: v, SEGM_METRIC: v / 2})
            for s, v in ((0, 0.31), (1, 0.27))]
    probes = [dict(_run(PROBE_CONTROL, 'probe', 0, {BBOX_METRIC: 0.004,
                                                    SEGM_METRIC: 0.002}),
                   recipe='lr-3e-4-warmup-1-epoch', loss=2.345),
              dict(_run(PROBE_CONTROL, 'detection', 0, {BBOX_METRIC: 0.05,
                                                        SEGM_METRIC: 0.04}),
                   recipe='lr-3e-4-warmup-1-epoch')]
    paths = write_report(runs, probes, _costs(DETECTORS[:2]), DETECTORS[:2],
                         SEGMENTORS[:1], SETTINGS, str(tmp_path))
    table = (tmp_path / 'table.md').read_text()
    probe = (tmp_path / 'probe.md').read_text()
    assert ('| PVTv2-b2 (control) | lr 3e-4, warm-up 1 epoch | 0.004 | 0.002 | '
            '2.345 | 0.050 | 0.040 | 10.0 |') in probe
    assert probe.count('PVTv2-b2 (control)') == 1
    assert '**0.290** (0.310, 0.270)' in table
    assert table.count('not run') == 3  # 2 mAPs of the second row, 1 mIoU
    assert 'mask-rcnn_soft-tiny_fpn_demo.py' in table and '1,536×1,536' not in table
    assert 'training peak 1536×1536 (MiB)' in table
    for path in paths[3:]:
        assert Path(path).read_bytes()[:4] == b'\x89PNG'
    data = json.loads((tmp_path / 'comparison.json').read_text())
    assert data['settings']['epochs'] == 3 and len(data['detection']) == 2


def _tool(*args) -> SimpleNamespace:
    """The tool's ``main`` in this process (its training runs are processes of
    their own): the exit status and what it printed."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = load_tool('analysis/compare_backbones').main(list(args))
        except SystemExit as exit:  # argparse's errors
            status = exit.code
    return SimpleNamespace(returncode=status, stdout=stdout.getvalue(),
                           stderr=stderr.getvalue())


def test_tool_rejects_unknown_names():
    done = _tool('--detectors', 'ResNet-101', '--phases', 'report')
    assert done.returncode != 0
    assert "--detectors: ['ResNet-101'] not known" in done.stderr


@pytest.mark.mmcv_ops  # builds the demo configs' backbones
def test_costs_are_the_benchmarks_rows(tmp_path):
    """The four cost runs at small sizes, in this process: the columns
    read their figures, mmsoft's also without the memory-efficient path."""
    from tests.test_benchmark import in_process
    entry = DETECTORS[0]
    sizes = dict(inference=(64, 64), flops=(32, 32), train=(64, 64), peak=(64, 96))
    costs = measure_costs([entry], sizes, 1, tmp_path, run=in_process)
    assert [r['label'] for r in costs['train']] == [entry.config, entry.config + PLAIN]
    assert [r['input'] for r in costs['peak']] == ['64x96'] * 2
    fields = comparison_rows([], costs, [entry], [])['detection'][0]
    assert 0 < fields['gflops_small'] < fields['gflops']
    assert fields['latency_s'] > 0 and fields['train_iter_s_plain'] > 0
    assert fields['train_peak_mib'] > 0 and fields['train_peak_mib_plain'] > 0
    assert json.loads((tmp_path / 'costs.json').read_text()) == costs


@pytest.mark.mmcv_ops  # trains an mmdet model
def test_tool_trains_and_reports(tmp_path, small_coco):
    """One run on the small generated dataset (one iteration and one
    validation), then the report; a second call, in a fresh work dir, reuses
    the records (``runs.json``) the first wrote beside the report."""
    work, out = tmp_path / 'work', tmp_path / 'out'
    common = ['--seeds', '0', '--jobs', '1', '--work-dir', str(work), '--out-dir',
              str(out), '--epochs', '1', '--detectors', 'SOFT++ half-width (demo)',
              '--segmentors']
    done = _tool(*common, '--phases', 'train', 'report', '--cfg-options',
                 f'train_dataloader.dataset.data_root={small_coco}',
                 'train_dataloader.dataset.indices=2',
                 f'val_dataloader.dataset.data_root={small_coco}',
                 f'val_evaluator.ann_file={small_coco}/annotations/instances_val.json')
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((work / 'detection' / 'mask-rcnn_soft-tiny_fpn_demo_seed0'
                         / 'result.json').read_text())
    assert 0 <= result['metrics'][BBOX_METRIC] <= 1 and result['seed'] == 0
    assert f"**{result['metrics'][BBOX_METRIC]:.3f}**" in (out / 'table.md').read_text()
    (out / 'table.md').unlink()
    fresh = _tool(*[str(tmp_path / 'fresh') if a == str(work) else a for a in common],
                  '--phases', 'train', 'report')
    assert fresh.returncode == 0 and 'training' not in fresh.stdout, fresh.stderr
    assert f"**{result['metrics'][BBOX_METRIC]:.3f}**" in (out / 'table.md').read_text()
