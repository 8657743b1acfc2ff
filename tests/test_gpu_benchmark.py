"""The GPU benchmark (tools/analysis/gpu_benchmark.py) without a GPU: its
cases and protocol, the padded inputs, the kernel and busy-time counting on
profiler events, rows, ratios and targets computed from the numbers, the
budget, the refusal of CUDA, a worker killed at its limit, the detectors,
and its CPU smoke mode end to end (also through tools/gpu_check_offline.sh)."""
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from mmsoft_analysis import gpu_benchmark as bench
from mmsoft_analysis.gpu_benchmark import BenchmarkSettings, Case, make_cases
from mmsoft_analysis.gpu_benchmark_report import (TARGETS, aggregate,
                                                  evaluate_targets, format_markdown,
                                                  ratio_rows)
from mmsoft_analysis.gpu_benchmark_steps import (KERNEL, LAUNCH, MEMCPY, MEMSET,
                                                 InputSpec, activity_counts,
                                                 activity_kind, profiler_activities,
                                                 union_length)

REPO = Path(__file__).resolve().parents[1]
TOOL = str(REPO / 'tools' / 'analysis' / 'gpu_benchmark.py')
OFFLINE = REPO / 'tools' / 'gpu_check_offline.sh'
SETTINGS = (('train', 'float32'), ('train', 'amp'), ('inference', 'float32'),
            ('inference', 'amp'))


def run_tool(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def test_cases_alternate_the_models_round_after_round():
    settings = BenchmarkSettings(device='cpu', models=['soft++-tiny', 'ufo-vit-small',
                                                       'swin-t'], rounds=3, steps=30)
    cases = make_cases(settings, 'eager', 'cuda')
    assert [(c.round, c.model) for c in cases] == [
        (0, 'soft++-tiny'), (0, 'ufo-vit-small'), (0, 'swin-t'),
        (1, 'swin-t'), (1, 'ufo-vit-small'), (1, 'soft++-tiny'),
        (2, 'soft++-tiny'), (2, 'ufo-vit-small'), (2, 'swin-t')]
    assert all(c.settings == SETTINGS for c in cases)
    assert cases[0].input.shapes == ((800, 1199), (800, 1067))
    assert cases[0].input.canvas == (800, 1216)
    # The memory phase: its own models, 1536x1536, training only, one round.
    memory = make_cases(settings, 'memory', 'cuda')
    assert [(c.model, c.round, c.settings) for c in memory] == [
        (m, 0, (('train', 'float32'), ('train', 'amp')))
        for m in ('soft++-tiny', 'ufo-vit-small', 'swin-t')]
    assert memory[0].input.canvas == (1536, 1536)
    # Mask R-CNN: the target's pair in one phase, the others in a later one.
    settings.detector_models = bench.DETECTOR_MODELS
    detector = make_cases(settings, 'detector', 'cuda', detector='torchvision')
    assert [(c.model, c.round) for c in detector] == [
        ('soft++-tiny', 0), ('swin-t', 0), ('swin-t', 1), ('soft++-tiny', 1),
        ('soft++-tiny', 2), ('swin-t', 2)]
    assert {c.detector for c in detector} == {'torchvision'}
    others = make_cases(settings, 'detector-others', 'cuda', detector='torchvision')
    assert [(c.model, c.round) for c in others[:5]] == [
        ('ufo-vit-small', 0), ('soft++-small', 0), ('pvtv2-b2', 0),
        ('pvtv2-b2-li', 0), ('pvtv2-b2-li', 1)]
    assert len(others) == 4 * 3 and others[0].detector == 'torchvision'
    assert bench.DEFAULT_PHASES == ('eager', 'memory', 'detector', 'tests', 'regions',
                                    'detector-others', 'single', 'compiled')
    assert all(c.compiled for c in make_cases(settings, 'compiled', 'cuda'))
    assert make_cases(settings, 'tests', 'cuda') == []
    single = make_cases(settings, 'single', 'cuda')[0].input
    assert (single.shapes, single.canvas) == (((800, 1333), ), (800, 1344))
    # mmdet's peers only where asked for or importable; timm's named as such.
    assert bench.resolve_backbone('swin-t', 'timm') == 'swin-t'
    assert bench.resolve_backbone('soft++-tiny', 'mmdet') == 'soft++-tiny'
    assert bench.resolve_backbone('pvtv2-b2', 'mmdet') == 'mmdet-pvtv2-b2'
    assert Case('eager', 'swin-t', 'swin-t', 0, single, ()).label() == 'Swin-T (timm)'


def test_protocol_splits_the_timed_steps_over_the_rounds():
    settings = BenchmarkSettings(device='cpu', rounds=2, warmup=10, steps=30,
                                 profile_steps=2)
    eager = settings.protocol(bench.PHASES['eager'], 'cuda')
    assert eager == dict(rounds=2, warmup=10, steps=15, profile_steps=2,
                         regions=False)
    assert settings.protocol(bench.PHASES['eager'], 'cpu')['profile_steps'] == 0
    assert settings.protocol(bench.PHASES['memory'], 'cuda') == dict(
        rounds=1, warmup=2, steps=3, profile_steps=0, regions=False)
    assert settings.protocol(bench.PHASES['regions'], 'cuda')['regions']
    odd = BenchmarkSettings(device='cpu', rounds=4, steps=30)
    assert odd.protocol(bench.PHASES['single'], 'cuda')['steps'] == 8  # ceil(30 / 4)
    smoke = BenchmarkSettings(device='cpu', smoke=True)
    assert smoke.inputs()['coco'].canvas == (32, 64)
    assert smoke.markdown == 'work_dirs/gpu_benchmark/gpu_benchmark.md'
    assert smoke.compile_backend == 'eager'


@pytest.mark.parametrize('changes, message', [
    (dict(rounds=0), 'rounds=0 is invalid; expected an integer >= 1'),
    (dict(warmup=-1), 'warmup=-1 is invalid; expected an integer >= 0'),
    (dict(budget_s=-5), 'budget_s=-5 is invalid; expected a number >= 0'),
    (dict(models=['swin-s']), "model='swin-s' is not supported; expected one of"),
    (dict(models=[]), 'no model given; expected one or more of'),
    (dict(phases=['fast']), "phase='fast' is not supported"),
    (dict(precisions=['float16']), "precision='float16' is not supported"),
    (dict(amp_dtype='int8'), "amp_dtype='int8' is not supported"),
    (dict(peers='hf'), "peers='hf' is not supported"),
])
def test_settings_are_checked(changes, message):
    with pytest.raises(ValueError, match=message.replace('[', r'\[')):
        BenchmarkSettings(device='cpu', **changes)


def test_inputs_are_padded_to_32_and_zero_outside_each_valid_region():
    spec = InputSpec('two', ((40, 70), (33, 50)))
    assert spec.batch == 2 and spec.canvas == (64, 96)
    assert spec.describe() == 'batch 2: 40x70, 33x50 on 64x96'
    images = spec.images(torch.device('cpu'))
    assert images.shape == (2, 3, 64, 96)
    assert images[0, :, :40, :70].abs().min() > 0 and images[0, :, 40:].abs().sum() == 0
    assert images[1, :, :, 50:].abs().sum() == 0 and images[1, :, 33:].abs().sum() == 0
    with pytest.raises(ValueError, match=r"input 'bad': shape \(0, 5\) is invalid"):
        InputSpec('bad', ((0, 5), ))


def test_activities_are_classified_and_the_busy_time_is_a_union():
    assert union_length([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert union_length([]) == 0
    # Kineto's kinds where the build reports them, names where it does not.
    assert activity_kind('ampere_sgemm', True, 'kernel') == KERNEL
    assert activity_kind('Memcpy HtoD', True, 'gpu_memcpy') == MEMCPY
    assert activity_kind('Memset (Device)', True) == MEMSET
    assert activity_kind('Memcpy DtoD', True) == MEMCPY
    assert activity_kind('void elementwise_kernel<...>', True) == KERNEL
    assert activity_kind('mmsoft-region: MLP', True, 'gpu_user_annotation') is None
    assert activity_kind('ProfilerStep#1', True, None, annotation=True) is None
    assert activity_kind('cudaLaunchKernel', False, 'cuda_runtime') == LAUNCH
    assert activity_kind('cuLaunchKernelEx', False) == LAUNCH
    assert activity_kind('cudaGraphLaunch', False, 'cuda_runtime') == LAUNCH
    assert activity_kind('cudaMemcpyAsync', False, 'cuda_runtime') is None
    assert activity_kind('aten::mm', False, 'cpu_op') is None
    # Two steps: 3 kernels and a copy each, overlapping on two streams.
    ns = 1_000_000
    events = [(KERNEL, 0, 2 * ns), (KERNEL, 1 * ns, 3 * ns), (MEMSET, 5 * ns, 6 * ns),
              (KERNEL, 10 * ns, 11 * ns), (KERNEL, 12 * ns, 14 * ns),
              (KERNEL, 13 * ns, 15 * ns), (MEMCPY, 15 * ns, 16 * ns),
              (KERNEL, 20 * ns, 21 * ns)] + [(LAUNCH, 0, 1)] * 6
    counts = activity_counts(events, steps=2)
    assert counts == dict(kernels=3, copies=1, launch_calls=3,
                          busy_ms=(3 + 1 + 1 + 4 + 1) / 2)
    assert activity_counts(events[:3], steps=1)['launch_calls'] is None


class _KinetoEvent:
    """Kineto's event interface: methods, not attributes."""

    def __init__(self, name, device_type, start, duration, activity=None):
        self._fields = dict(name=name, device_type=device_type, start_ns=start,
                            duration_ns=duration, activity_type=activity,
                            is_user_annotation=activity == 'user_annotation')

    def __getattr__(self, field):
        return lambda: self._fields[field]


def test_profiler_activities_read_kineto_events():
    from torch.autograd import DeviceType
    events = [_KinetoEvent('aten::mm', DeviceType.CPU, 0, 50, 'cpu_op'),
              _KinetoEvent('cudaLaunchKernel', DeviceType.CPU, 5, 3, 'cuda_runtime'),
              _KinetoEvent('sm90_gemm', DeviceType.CUDA, 20, 30, 'kernel'),
              _KinetoEvent('mmsoft-region: MLP', DeviceType.CPU, 0, 60,
                           'user_annotation')]

    class Profile:
        class profiler:
            class kineto_results:
                events = staticmethod(lambda: events)

    assert profiler_activities(Profile) == [(LAUNCH, 5, 8), (KERNEL, 20, 50)]


def synthetic_records(seed=0):
    """Records of two rounds of the eager, memory and detector phases for
    the targets' models, with random times, kernels, busy times and memory."""
    rng = random.Random(seed)
    spec = InputSpec('coco-b2', ((800, 1199), (800, 1067)))
    records = []
    for phase in ('eager', 'memory', 'detector'):
        for round_index in range(2):
            for model in ('soft++-tiny', 'soft++-small', 'ufo-vit-small', 'swin-t',
                          'pvtv2-b2', 'pvtv2-b2-li'):
                case = Case(phase, model, model, round_index, spec, SETTINGS)
                for mode, precision in SETTINGS:
                    times = [rng.uniform(20, 400) for _ in range(5)]
                    counted = round_index == 0
                    records.append(case.record(
                        mode, precision, 'ok', times_ms=times,
                        host_ms=[t * 0.9 for t in times],
                        kernels=float(rng.randint(500, 9000)) if counted else None,
                        busy_ms=rng.uniform(5, 20) if counted else None,
                        copies=2. if counted else None,
                        launch_calls=None,
                        max_memory_allocated_mib=rng.uniform(500, 9000),
                        max_memory_reserved_mib=rng.uniform(9000, 12000)))
    return records


def test_rows_ratios_and_targets_come_from_the_numbers():
    records = synthetic_records()
    rows = aggregate(records)
    assert len(rows) == 3 * 6 * 4
    row = next(r for r in rows if r['phase'] == 'eager' and r['model'] == 'soft++-tiny'
               and r['mode'] == 'train' and r['precision'] == 'amp')
    mine = [r for r in records if r['phase'] == 'eager' and r['model'] == 'soft++-tiny'
            and r['mode'] == 'train' and r['precision'] == 'amp']
    times = mine[0]['times_ms'] + mine[1]['times_ms']
    assert row['steps'] == 10 and row['rounds'] == 2 and row['status'] == 'ok'
    assert row['median_ms'] == statistics.median(times)
    assert row['min_ms'] == min(times) and row['max_ms'] == max(times)
    assert row['q1_ms'] <= row['median_ms'] <= row['q3_ms']
    assert row['round_medians_ms'] == [statistics.median(r['times_ms']) for r in mine]
    assert row['kernels'] == mine[0]['kernels']  # the round that counted them
    assert row['busy_share'] == mine[0]['busy_ms'] / row['median_ms']
    assert row['max_memory_allocated_mib'] == max(r['max_memory_allocated_mib']
                                                  for r in mine)
    by_key = {(r['phase'], r['model'], r['precision'], r['mode']): r for r in rows}
    ratios = ratio_rows(rows)
    assert len(ratios) == 3 * 4 * 4  # 4 pairs, 4 settings, 3 phases
    for ratio in ratios:
        model = by_key[(ratio['phase'], ratio['model'], ratio['precision'],
                        ratio['mode'])]
        peer = by_key[(ratio['phase'], ratio['peer'], ratio['precision'],
                       ratio['mode'])]
        assert ratio['time'] == model['median_ms'] / peer['median_ms']
        assert ratio['kernels'] == model['kernels'] / peer['kernels']
        assert ratio['memory'] == (model['max_memory_allocated_mib'] /
                                   peer['max_memory_allocated_mib'])
    targets = evaluate_targets(rows)
    assert len(targets) == 2 * len(TARGETS)
    metric = {'time': 'median_ms', 'kernels': 'kernels',
              'memory': 'max_memory_allocated_mib', 'busy_share': 'busy_share'}
    for target in targets:
        model = by_key[(target['phase'], target['model'], target['precision'],
                        target['mode'])]
        value = model[metric[target['metric']]]
        if target['peer']:
            value /= by_key[(target['phase'], target['peer'], target['precision'],
                             target['mode'])][metric[target['metric']]]
        assert target['value'] == pytest.approx(value)
        met = value >= target['goal'] if target['at_least'] else value <= target['goal']
        assert target['status'] == ('met' if met else 'missed')
        assert model['label'] in target['why']
    # Another draw of the numbers gives other verdicts: nothing is fixed.
    verdicts = {tuple(t['status'] for t in evaluate_targets(aggregate(
        synthetic_records(seed)))) for seed in range(6)}
    assert len(verdicts) > 1


def test_targets_say_what_was_not_measured():
    records = [r for r in synthetic_records() if r['model'] != 'swin-t'
               and r['phase'] == 'eager']
    failed = dict(records[0], status='error', times_ms=None, host_ms=None,
                  round=1, error='OutOfMemoryError: CUDA out of memory')
    for record in records:
        if (record['model'], record['mode'], record['precision']) == (
                'soft++-small', 'train', 'float32'):
            record.update(status='error', times_ms=None, kernels=None,
                          error='OutOfMemoryError: CUDA out of memory')
    rows = aggregate(records + [failed])
    targets = {(t['target'], t['precision']): t for t in evaluate_targets(rows)}
    tiny = targets[('soft++-tiny / swin-t, training step time <= 1x', 'float32')]
    assert tiny['status'] == 'not measured' and tiny['reason'] == 'swin-t not run'
    small = targets[('soft++-small, GPU busy share of the training step >= 80%',
                     'float32')]
    assert small['status'] == 'not measured'
    assert small['reason'].startswith('soft++-small error: OutOfMemoryError')
    partial = next(r for r in rows if r['model'] == 'soft++-tiny'
                   and r['mode'] == 'train' and r['precision'] == 'float32')
    assert partial['status'] == 'partial' and partial['rounds'] == 2
    assert targets[('soft++-tiny, GPU busy share of the training step >= 80%',
                    'float32')]['status'] in ('met', 'missed')
    memory = targets[('soft++-tiny / swin-t, max_memory_allocated of the training '
                      'step <= 0.5x', 'amp')]
    assert memory['reason'] == 'soft++-tiny not run'  # no memory phase


def test_markdown_has_the_targets_every_row_and_the_ratios():
    records = synthetic_records()
    records.append(Case('compiled', 'swin-t', 'swin-t', 0,
                        InputSpec('coco-b2', ((64, 64), )), SETTINGS).record(
        'train', 'float32', 'skipped', note='the budget was spent'))
    data = dict(meta=dict(device='cuda', device_name='GPU', protocol=dict(
        warmup=10, steps_per_round=15, rounds=2, steps=30, profile_steps=2,
        meets_protocol_minimum=True)), records=records, tests=dict(ran=False),
        phases=dict(eager=dict(seconds=12.5, cases=12)))
    data['rows'] = aggregate(records)
    data['ratios'] = ratio_rows(data['rows'])
    data['targets'] = evaluate_targets(data['rows'])
    data['summary'] = bench.summarise(records)
    markdown = format_markdown(data)
    assert markdown.startswith('# GPU benchmark')
    assert '## Targets on the GPU' in markdown
    assert markdown.count('| soft++-tiny / swin-t, training step time <= 1x |') == 2
    assert '## Backbones, eager (eager): batch 2: 800x1199, 800x1067 on 800x1216' \
        in markdown
    assert '## Mask R-CNN, eager (detector)' in markdown
    for row in data['rows'][:-1]:
        assert f"| {row['label']} | {row['precision']} | {row['mode']} | " \
            f"{row['median_ms']:.1f} |" in markdown
    assert '| Swin-T (timm) | float32 | train | - |' in markdown  # skipped
    assert '| eager | amp | train | SOFT++-small / PVTv2-b2-li (timm) |' in markdown
    assert 'skipped: the budget was spent' in markdown
    assert 'Seconds per phase: eager 12.' in markdown


def test_budget_skips_the_rest_and_the_phases_run_in_the_order_given(monkeypatch,
                                                                   tmp_path):
    """Measured cases are faked; the clock moves 100 s per case. (Two of
    mmsoft's models: the floor environment has no timm for the peers.)"""
    now = [0.]
    ran = []

    def fake_measure(case, request, timeout_s, budget_bound):
        ran.append((case.phase, case.model, case.round, timeout_s, budget_bound))
        now[0] += 100
        return [case.record(mode, precision, 'ok', times_ms=[10., 12.],
                            host_ms=[1., 1.]) for mode, precision in case.settings]

    monkeypatch.setattr(bench, 'measure_in_subprocess', fake_measure)
    (tmp_path / 'test_ok.py').write_text('def test_ok():\n    assert True\n')
    settings = BenchmarkSettings(
        out=str(tmp_path / 'out' / 'b.json'), device='cpu',
        models=['soft++-tiny', 'ufo-vit-small'], phases=['single', 'tests', 'eager'],
        budget_s=450, case_timeout_s=150, tests=[str(tmp_path / 'test_ok.py')])
    data = bench.run_benchmark(settings, log=lambda line: None,
                               clock=lambda: now[0])
    # Each case gets its hard limit, or what is left of the budget.
    assert ran == [('single', 'soft++-tiny', 0, 150, False),
                   ('single', 'ufo-vit-small', 0, 150, False),
                   ('single', 'ufo-vit-small', 1, 150, False),
                   ('single', 'soft++-tiny', 1, 150, True),
                   ('eager', 'soft++-tiny', 0, 50, True)]
    assert data['tests']['passed'] == 1  # with 50 s left
    skipped = [r for r in data['records'] if r['status'] == 'skipped']
    assert {r['note'] for r in skipped} == {'the budget was spent'}
    assert [(r['phase'], r['model'], r['round']) for r in skipped[::4]] == [
        ('eager', 'ufo-vit-small', 0), ('eager', 'ufo-vit-small', 1), ('eager', 'soft++-tiny', 1)]
    assert list(data['phases']) == ['single', 'tests', 'eager']
    written = json.loads((tmp_path / 'out' / 'b.json').read_text())
    assert len(written['records']) == len(data['records']) == 8 * 4
    assert 'Skipped: eager ufo-vit-small float32 train, round 1;' in \
        (tmp_path / 'out' / 'b.md').read_text()
    assert bench.passed(data)


def test_a_worker_past_its_limit_is_killed_and_its_settings_recorded():
    spec = InputSpec('tiny', ((32, 32), ))
    case = Case('eager', 'soft++-tiny', 'soft++-tiny', 0, spec,
                (('train', 'float32'), ('inference', 'float32')))
    request = dict(device='cpu', threads=1, compile_backend='eager',
                   compile_mode=None, amp_dtype='bfloat16', smoke=True,
                   protocol=dict(rounds=1, warmup=0, steps=1, profile_steps=0,
                                 regions=False))
    records = bench.measure_in_subprocess(case, request, 0.5, budget_bound=False)
    assert [(r['mode'], r['status']) for r in records] == [('train', 'error'),
                                                          ('inference', 'error')]
    assert records[0]['error'] == 'timed out after 0 s (the hard limit of a case)'
    records = bench.measure_in_subprocess(case, request, 0.5, budget_bound=True)
    assert {r['note'] for r in records} == {'the budget ran out during its case'}


@pytest.mark.torchvision
def test_workers_measure_a_detector_and_profile_regions_in_process():
    pytest.importorskip('torchvision')
    pytest.importorskip('timm')
    spec = InputSpec('coco-b2', ((32, 64), (32, 48)))
    protocol = dict(rounds=1, warmup=0, steps=2, profile_steps=0, regions=False)
    request = dict(device='cpu', threads=1, compile_backend='eager', compile_mode=None,
                   amp_dtype='bfloat16', smoke=True, protocol=protocol)
    detector = Case('detector', 'soft++-tiny', 'soft++-tiny', 0, spec,
                    (('train', 'amp'), ), detector='torchvision')
    threads = torch.get_num_threads()
    try:
        record, = bench.run_case(detector, request)
    finally:
        torch.set_num_threads(threads)
    assert record['status'] == 'ok', record['error']
    assert len(record['times_ms']) == 2 and record['detector'] == 'torchvision'
    assert record['valid_regions'] and 20 < record['params_m'] < 60
    profiled = Case('regions', 'soft++-tiny', 'soft++-tiny', 0, spec,
                    (('inference', 'float32'), ))
    try:
        record, = bench.run_case(profiled, dict(request, protocol=dict(protocol,
                                                                      regions=True)))
    finally:
        torch.set_num_threads(threads)
    assert record['status'] == 'ok', record['error']
    regions = record['regions']
    assert {'kernel inverse', 'kernel products', 'MLP'} <= set(regions)
    assert regions['MLP']['gflop'] > 0 and regions['MLP']['tflop_per_s'] > 0
    assert all(entry['kernels'] == 0 for entry in regions.values())  # no GPU
    assert record['matmul_tflop_per_s'] > 0


@pytest.mark.torchvision
def test_detection_backbone_hands_the_valid_regions_to_mmsoft():
    pytest.importorskip('torchvision')
    pytest.importorskip('timm')
    from mmsoft_analysis.gpu_benchmark_detectors import (generated_targets,
                                                         torchvision_mask_rcnn)
    spec = InputSpec('two', ((32, 64), (32, 40)))
    images, targets = generated_targets(spec, torch.device('cpu'))
    assert [tuple(i.shape) for i in images] == [(3, 32, 64), (3, 32, 40)]
    for target, (height, width) in zip(targets, spec.shapes):
        boxes = target['boxes']
        assert boxes.shape == (7, 4) and (boxes[:, 2:] > boxes[:, :2]).all()
        assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
        assert target['masks'].shape == (7, height, width)
    for name in ('soft++-tiny', 'swin-t'):  # swin-t: timm's NHWC maps
        model = torchvision_mask_rcnn(name, light_heads=True).eval()
        with torch.no_grad():
            image_list, _ = model.transform(images)
            levels = model.backbone(image_list.tensors)
        assert image_list.tensors.shape == (2, 3, 32, 64)  # padded, not resized
        assert list(levels) == ['0', '1', '2', '3', 'pool']
        assert [tuple(v.shape[1:]) for v in levels.values()] == [
            (256, 8, 16), (256, 4, 8), (256, 2, 4), (256, 1, 2), (256, 1, 1)]
        maps = model.backbone.maps
        assert maps.valid_shapes == ([(32, 64), (32, 40)] if name == 'soft++-tiny'
                                     else None)


def load_tool():
    """tools/analysis/gpu_benchmark.py as a module (its ``main``)."""
    spec = importlib.util.spec_from_file_location('gpu_benchmark_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CUDA device is present')
def test_refuses_cuda_without_a_gpu(tmp_path, capsys):
    tool = load_tool()
    assert tool.main(['--out', str(tmp_path / 'never.json')]) == 2
    message = capsys.readouterr().err
    assert message.startswith("gpu_benchmark: device='cuda' needs a CUDA device, but "
                              'torch.cuda.is_available() is False')
    assert bench.CPU_SMOKE_COMMAND in message
    assert not (tmp_path / 'never.json').exists()
    assert tool.main(['--device', 'cpu', '--steps', '0']) == 2
    assert 'steps=0 is invalid; expected an integer >= 1' in capsys.readouterr().err


@pytest.mark.torchvision  # timm
def test_cpu_smoke_run_writes_every_table_from_its_numbers(tmp_path):
    """Two models, each in a process of its own (one round: the rounds'
    order is tested above), four settings each."""
    pytest.importorskip('timm')
    out = tmp_path / 'bench' / 'b.json'
    done = run_tool('--device', 'cpu', '--smoke', '--models', 'soft++-tiny', 'swin-t',
                    '--phases', 'eager', '--rounds', '1', '--warmup', '0',
                    '--out', str(out), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    meta = data['meta']
    assert meta['device'] == 'cpu' and meta['torch'] == torch.__version__
    for field in ('host_cpu', 'tf32_matmul', 'tf32_cudnn', 'float32_matmul_precision',
                  'cuda', 'device_name', 'commit'):
        assert field in meta
    assert meta['protocol']['steps'] == 2 and meta['protocol']['rounds'] == 1
    assert not meta['protocol']['meets_protocol_minimum']
    records = data['records']
    assert [(r['model'], r['round']) for r in records[::4]] == [
        ('soft++-tiny', 0), ('swin-t', 0)]
    assert [(r['mode'], r['precision']) for r in records[:4]] == list(SETTINGS)
    for record in records:
        assert record['status'] == 'ok', record
        assert record['warmup'] == 0 and record['steps'] == 2
        assert len(record['times_ms']) == 2 and min(record['times_ms']) > 0
        assert record['timer'] == 'perf_counter'
        for cuda_only in ('kernels', 'busy_ms', 'max_memory_allocated_mib',
                          'max_memory_reserved_mib', 'launch_calls'):
            assert record[cuda_only] is None
        assert record['valid_regions'] == (record['model'] == 'soft++-tiny')
    assert {r['label'] for r in records} == {'SOFT++-tiny', 'Swin-T (timm)'}
    rows = {(r['model'], r['mode'], r['precision']): r for r in data['rows']}
    for (model, mode, precision), row in rows.items():
        mine, = [r['times_ms'] for r in records
                 if (r['model'], r['mode'], r['precision']) == (model, mode, precision)]
        assert row['steps'] == 2 and row['median_ms'] == statistics.median(mine)
        assert row['q1_ms'] <= row['median_ms'] <= row['q3_ms']
    for ratio in data['ratios']:
        assert ratio['time'] == pytest.approx(
            rows[('soft++-tiny', ratio['mode'], ratio['precision'])]['median_ms'] /
            rows[('swin-t', ratio['mode'], ratio['precision'])]['median_ms'])
    assert len(data['ratios']) == 4
    targets = {(t['phase'], t['metric'], t['model'], t['mode'], t['precision']): t
               for t in data['targets']}
    for mode, goal in (('train', 1.), ('inference', 0.8)):
        for precision in ('float32', 'amp'):
            target = targets[('eager', 'time', 'soft++-tiny', mode, precision)]
            ratio = (rows[('soft++-tiny', mode, precision)]['median_ms'] /
                     rows[('swin-t', mode, precision)]['median_ms'])
            assert target['value'] == pytest.approx(ratio)
            assert target['status'] == ('met' if ratio <= goal else 'missed')
    assert targets[('eager', 'kernels', 'soft++-tiny', 'train', 'amp')]['reason'] == \
        "soft++-tiny's kernels is not measured on this device"
    assert targets[('eager', 'time', 'ufo-vit-small', 'train', 'amp')]['reason'] == \
        'ufo-vit-small not run'
    assert targets[('detector', 'time', 'soft++-tiny', 'train', 'amp')]['reason'] == \
        'soft++-tiny not run'
    markdown = (tmp_path / 'bench' / 'b.md').read_text()
    assert '**CPU smoke mode**' in markdown
    assert '## Ratios against the peers' in markdown
    assert '| SOFT++-tiny | amp | inference |' in markdown
    assert data['summary'] == dict(ok=8, error=0, skipped=0, skipped_cases=[],
                                   failed_cases=[])
    assert 'Seconds per phase: eager' in done.stdout


def _tiny_wheel(folder: Path) -> None:
    """A pure-Python wheel of one empty module: a bundle for the offline
    runner to install."""
    folder.mkdir()
    info = 'benchmark_probe-0.1.dist-info'
    with zipfile.ZipFile(folder / 'benchmark_probe-0.1-py3-none-any.whl', 'w') as wheel:
        wheel.writestr('benchmark_probe.py', '')
        wheel.writestr(f'{info}/METADATA', 'Metadata-Version: 2.1\nName: '
                       'benchmark-probe\nVersion: 0.1\n')
        wheel.writestr(f'{info}/WHEEL', 'Wheel-Version: 1.0\nGenerator: test\n'
                       'Root-Is-Purelib: true\nTag: py3-none-any\n')
        wheel.writestr(f'{info}/RECORD', f'benchmark_probe.py,,\n{info}/METADATA,,\n'
                       f'{info}/WHEEL,,\n{info}/RECORD,,\n')


def test_the_offline_runner_runs_the_benchmark(tmp_path):
    """tools/gpu_check_offline.sh --benchmark: the bundle installed, the
    benchmark run in its CPU smoke mode within the budget (its tests phase
    alone, on a test file of its own), its files written."""
    _tiny_wheel(tmp_path / 'bundle')
    (tmp_path / 'test_probe.py').write_text(
        'import benchmark_probe\n\ndef test_probe():\n    assert True\n')
    env = {k: v for k, v in os.environ.items()
           if k not in ('MMSOFT_GPU_CHECK_DEVICE', 'PYTHONPATH')}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS='1')
    done = subprocess.run(
        ['bash', str(OFFLINE), str(tmp_path / 'bundle'), str(tmp_path / 'out'),
         '--benchmark', '--allow-cpu', '--budget-s', '200', '--phases', 'tests',
         '--tests', str(tmp_path / 'test_probe.py')],
        capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / 'out' / 'gpu_benchmark.json').read_text())
    assert '--device cpu --smoke' in data['meta']['command']
    assert 0 < data['meta']['budget_s'] < 200
    # The bundle's module imported in the tests: it was installed.
    assert data['tests']['passed'] == 1 and data['records'] == []
    markdown = (tmp_path / 'out' / 'gpu_benchmark.md').read_text()
    assert markdown.startswith('# GPU benchmark')
    assert 'Offline run: exit status 0; total ' in markdown
    assert (tmp_path / 'out' / 'gpu_benchmark.log').stat().st_size > 0
