"""The GPU check (tools/analysis/gpu_check.py): its case list, time budget,
failure handling, test-report parsing, CUDA refusal and, on CPU at a tiny
size, the results file of its benchmark part."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmsoft_analysis import gpu_check
from mmsoft_analysis.gpu_check import (CPU_SMOKE_COMMAND, Case, make_cases,
                                       require_device, run_benchmark, run_tests)
from mmsoft_analysis.measure import run_once

REPO = Path(__file__).resolve().parents[1]
TOOL = str(REPO / 'tools/analysis/gpu_check.py')
RECORD_KEYS = {'backbone', 'solver', 'dtype', 'height', 'width', 'mode', 'status',
               'host_sync',
               'time_ms', 'all_time_ms', 'max_memory_mib', 'memory_above_start_mib',
               'params_m', 'error'}


def run_tool(*args, timeout=300):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_cases_come_size_by_size_with_one_model_per_solver():
    cases = make_cases(['soft++-tiny', 'swin-t'], ['newton', 'exact'],
                       ['float32', 'float16'], [(64, 64), (32, 48)],
                       ['train', 'inference'])
    # 2 sizes x (2 SOFT++ solvers + Swin-T) x 2 dtypes x 2 modes.
    assert len(cases) == 24 and len(set(cases)) == 24
    assert [c.size for c in cases] == [(64, 64)] * 12 + [(32, 48)] * 12
    models = [c.model_key for c in cases[:12]]
    assert models == ([('soft++-tiny', 'newton')] * 4 +
                      [('soft++-tiny', 'exact')] * 4 + [('swin-t', None)] * 4)
    assert cases[0].label() == 'soft++-tiny/newton float32 64x64 train'
    assert cases[11].label() == 'swin-t float16 64x64 inference'
    with pytest.raises(ValueError, match="backbone='resnet-50' is not supported"):
        make_cases(['resnet-50'], ['newton'], ['float32'], [(64, 64)], ['train'])
    with pytest.raises(ValueError, match="solver='lu' is not supported"):
        make_cases(['soft++-tiny'], ['lu'], ['float32'], [(64, 64)], ['train'])


def test_backbones_are_the_shipped_configs_without_checkpoints():
    soft = gpu_check.backbone_config('soft++-small', 'exact')
    assert (soft['type'], soft['arch'], soft['variant']) == ('SOFT', 'small',
                                                               'soft++')
    assert soft['solver'] == 'exact' and soft['max_bottleneck_tokens'] == 256
    assert soft['init_cfg'] is None
    # The cached config is not changed by the solver or init_cfg override.
    assert gpu_check.backbone_config('soft++-small')['solver'] == 'newton_closed_form'
    swin = gpu_check.backbone_config('swin-t')
    assert swin['type'] == 'SwinTransformer' and swin['init_cfg'] is None
    assert gpu_check.backbone_config('pvtv2-b2')['type'] == 'PyramidVisionTransformerV2'


class FakeClock:
    """Time that passes only when a measurement runs."""

    def __init__(self):
        self.now = 0.

    def __call__(self):
        return self.now


def test_budget_skips_the_rest_and_failures_do_not_stop_it(monkeypatch):
    clock, builds = FakeClock(), []

    def build(name, solver, device):
        builds.append((name, solver))
        if name == 'pvtv2-b2':
            raise KeyError('PyramidVisionTransformerV2 is not in the registry')
        return nn.Identity()

    def measure(model, case, device, warmup, repeats):
        clock.now += 10.  # each measurement takes 10 s
        if case.mode == 'inference' and case.dtype == 'float16':
            raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried 2 GiB')
        return dict(time_ms=5.)

    monkeypatch.setattr(gpu_check, 'build_check_backbone', build)
    monkeypatch.setattr(gpu_check, 'measure_case', measure)
    cases = make_cases(['pvtv2-b2', 'soft++-tiny'], ['newton', 'exact'],
                       ['float32', 'float16'], [(64, 64)], ['train', 'inference'])
    seen = []
    records = run_benchmark(cases, torch.device('cpu'), budget_s=55.,
                            on_record=seen.append, clock=clock,
                            case_timeout_s=None)  # in this process
    assert seen == records and len(records) == len(cases) == 12
    # PVTv2 fails to build: its 4 cases are errors and take no time.
    assert [r['status'] for r in records[:4]] == ['error'] * 4
    assert all(r['error'] == "build failed: KeyError: 'PyramidVisionTransformerV2 "
               "is not in the registry'" for r in records[:4])
    # SOFT++ newton: measured at t = 0, 10, 20, 30; its fp16 inference OOMs.
    assert [r['status'] for r in records[4:8]] == ['ok', 'ok', 'ok', 'error']
    assert records[7]['error'] == ('OutOfMemoryError: CUDA out of memory. '
                                   'Tried 2 GiB')
    assert records[4]['time_ms'] == 5.
    # SOFT++ exact: t = 40, 50 measured; at t = 60 the 55 s budget is spent.
    assert [r['status'] for r in records[8:]] == ['ok', 'ok', 'skipped', 'skipped']
    assert builds == [('pvtv2-b2', None), ('soft++-tiny', 'newton'),
                      ('soft++-tiny', 'exact')]
    summary = gpu_check.summarise(records)
    assert (summary['ok'], summary['error'], summary['skipped']) == (5, 5, 2)
    assert summary['skipped_cases'] == ['soft++-tiny/exact float16 64x64 train',
                                        'soft++-tiny/exact float16 64x64 inference']
    table = gpu_check.format_table(records).splitlines()
    assert len(table) == 1 + 12
    assert table[8].split()[:8] == ['soft++-tiny', 'newton', 'float16', '64x64',
                                    'inference', '-', '-', 'error:']
    assert table[5].split()[5:] == ['5.0', '-', 'ok']


def test_settings_are_checked():
    with pytest.raises(ValueError, match='repeats=0 is invalid'):
        gpu_check.CheckSettings(repeats=0)
    with pytest.raises(ValueError, match='budget_s=-1 is invalid'):
        gpu_check.CheckSettings(budget_s=-1)
    with pytest.raises(ValueError, match="device type='mps' is not supported"):
        require_device('mps')


class OneMap(nn.Module):

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.output_dtypes = []

    def forward(self, images):
        out = self.conv(images)
        self.output_dtypes.append(out.dtype)
        return (out, )


def test_run_once_autocasts_the_forward_and_runs_the_backward():
    model = OneMap()
    gradient_dtypes = []
    model.conv.weight.register_hook(lambda grad: gradient_dtypes.append(grad.dtype))
    images = torch.randn(1, 3, 8, 8)
    run_once(model, images, backward=True, autocast_dtype=torch.bfloat16)
    run_once(model, images, backward=False, autocast_dtype=torch.bfloat16)
    run_once(model, images, backward=False)
    assert model.output_dtypes == [torch.bfloat16, torch.bfloat16, torch.float32]
    assert gradient_dtypes == [torch.float32]  # one backward, float32 weights
    assert model.conv.weight.grad is None  # dropped after the step


def test_run_tests_counts_outcomes(tmp_path):
    tests = tmp_path / 'test_outcomes.py'
    tests.write_text('import pytest\n\n'
                     'def test_passes():\n    assert True\n\n'
                     'def test_fails():\n    assert 1 == 2\n\n'
                     "@pytest.mark.skip(reason='no device')\n"
                     'def test_skipped():\n    pass\n')
    outcome = run_tests([str(tests)], timeout_s=120)
    assert outcome['returncode'] == 1
    assert {k: outcome[k] for k in ('total', 'passed', 'failed', 'errors',
                                    'skipped')} == dict(total=3, passed=1,
                                                        failed=1, errors=0,
                                                        skipped=1)
    # JUnit names the module relative to pytest's rootdir (the checkout's
    # location decides how much of tmp_path's path that keeps).
    assert len(outcome['failed_tests']) == 1
    assert outcome['failed_tests'][0].endswith('test_outcomes::test_fails')
    assert '1 failed, 1 passed, 1 skipped' in outcome['output_tail']
    assert gpu_check.describe_tests(outcome).startswith(
        'tests: 1 passed, 1 failed, 0 errors, 1 skipped in ')


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CUDA device is present')
def test_refuses_cuda_without_a_gpu(tmp_path):
    with pytest.raises(RuntimeError, match='needs a CUDA device') as raised:
        require_device('cuda')
    assert CPU_SMOKE_COMMAND in str(raised.value)
    assert require_device('cpu') == torch.device('cpu')
    done = run_tool('--out', str(tmp_path / 'never.json'), timeout=120)
    assert done.returncode == 2
    assert "device='cuda' needs a CUDA device" in done.stderr
    assert '--device cpu' in done.stderr
    assert not (tmp_path / 'never.json').exists()


def smoke_settings(out, **changes):
    """A CPU run of the benchmark part at 64x64 (float16 training on CPU
    is slow, so float32 unless told)."""
    settings = dict(out=str(out), device='cpu', backbones=['soft++-tiny', 'pvtv2-b2'],
                    solvers=['newton', 'exact'], dtypes=['float32'],
                    sizes=[(64, 64)], repeats=1, run_tests=False)
    settings.update(changes)
    return gpu_check.CheckSettings(**settings)


@pytest.mark.mmcv_ops  # builds through mmdet's registry (mmdet.models)
def test_cpu_smoke_run_writes_one_record_per_case(tmp_path):
    out = tmp_path / 'check' / 'gpu_check.json'
    lines = []
    returned = gpu_check.run_check(smoke_settings(out), log=lines.append)
    data = json.loads(out.read_text())
    assert data == returned
    meta = data['meta']
    assert meta['device'] == 'cpu' and meta['torch'] == torch.__version__
    assert {'device_name', 'cuda', 'cudnn', 'packages',
            'benchmark_seconds'} <= set(meta)
    assert (meta['budget_s'], meta['repeats'], meta['cases'], meta['batch']) == (
        360, 1, 6, 2)
    assert data['tests'] == {'ran': False}
    records = data['records']
    assert all(set(r) == RECORD_KEYS for r in records)
    # (SOFT++-tiny x 2 solvers + PVTv2-b2) x 2 modes at 64x64, in order.
    assert [(r['backbone'], r['solver'], r['mode']) for r in records] == [
        (b, s, m) for b, s in (('soft++-tiny', 'newton'), ('soft++-tiny', 'exact'),
                               ('pvtv2-b2', None))
        for m in ('train', 'inference')]
    for record in records:
        assert record['status'] == 'ok' and record['error'] is None, record
        assert (record['height'], record['width'], record['dtype']) == (64, 64,
                                                                        'float32')
        assert record['time_ms'] > 0 and len(record['all_time_ms']) == 1
        assert record['max_memory_mib'] is None  # CUDA's allocator only
        assert record['host_sync'] is None  # CUDA's sync debug mode only
        assert record['memory_above_start_mib'] is None
    params = {r['backbone']: r['params_m'] for r in records}
    assert 10 < params['soft++-tiny'] < 15 and 20 < params['pvtv2-b2'] < 30
    summary = data['summary']
    assert (summary['ok'], summary['error'], summary['skipped']) == (6, 0, 0)
    assert lines[0].startswith('[1/6] soft++-tiny/newton float32 64x64 train: ')
    assert lines[-1].startswith('[6/6] pvtv2-b2 float32 64x64 inference: ')
    assert gpu_check.check_passed(data)


@pytest.mark.mmcv_ops
def test_cpu_smoke_run_under_float16_autocast(tmp_path):
    out = tmp_path / 'gpu_check.json'
    data = gpu_check.run_check(
        smoke_settings(out, backbones=['soft++-tiny'], solvers=['newton_closed_form'],
                       dtypes=['float16'], modes=['inference']), log=lambda line: None)
    record, = data['records']
    assert (record['solver'], record['dtype'], record['status']) == (
        'newton_closed_form', 'float16', 'ok')
    assert record['time_ms'] > 0


def test_spent_budget_lists_every_case_as_skipped(tmp_path):
    out = tmp_path / 'gpu_check.json'
    done = run_tool('--device', 'cpu', '--sizes', '64x64', '32x32', '--budget-s',
                    '0', '--backbones', 'soft++-tiny', 'swin-t', '--solvers',
                    'newton', '--dtypes', 'float32', '--skip-tests', '--out',
                    str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    cases = make_cases(['soft++-tiny', 'swin-t'], ['newton'], ['float32'],
                       [(64, 64), (32, 32)], ['train', 'inference'])
    assert [(r['status'], r['time_ms']) for r in data['records']] == [
        ('skipped', None)] * 8
    assert data['summary']['skipped_cases'] == [c.label() for c in cases]
    assert Case('swin-t', None, 'float32', (32, 32), 'train').label() in done.stdout
    assert '0 measured, 0 failed, 8 skipped (budget 0 s)' in done.stdout


def test_closed_form_is_measured_once_on_a_gpu_where_it_is_the_iteration():
    solvers = ['newton_closed_form', 'newton', 'exact']
    on_gpu = make_cases(['soft++-tiny'], solvers, ['float32'], [(64, 64)], ['train'])
    on_cpu = make_cases(['soft++-tiny'], solvers, ['float32'], [(64, 64)], ['train'],
                        device_type='cpu')
    assert [case.solver for case in on_gpu] == ['newton', 'exact']
    assert [case.solver for case in on_cpu] == solvers


def test_host_syncs_fail_the_check_except_the_exact_solvers():
    records = [Case('soft++-tiny', solver, 'float32', (64, 64), 'train').record(
        'ok', host_sync=sync) for solver, sync in
        [('newton', 'none'), ('exact', 'RuntimeError: called a synchronizing op')]]
    data = dict(tests=dict(ran=False), summary=gpu_check.summarise(records))
    assert data['summary']['host_sync_cases'] == [] and gpu_check.check_passed(data)
    records.append(Case('ufo-vit-small', None, 'float32', (64, 64), 'train').record(
        'ok', host_sync='RuntimeError: called a synchronizing op'))
    data['summary'] = gpu_check.summarise(records)
    assert data['summary']['host_sync_cases'] == ['ufo-vit-small float32 64x64 train']
    assert not gpu_check.check_passed(data)


def test_a_case_past_its_hard_limit_is_killed():
    case = Case('soft++-tiny', 'newton', 'float32', (64, 64), 'train')
    start = time.monotonic()
    record = gpu_check.measure_in_subprocess(case, torch.device('cpu'), 0, 1,
                                             timeout_s=0.5)
    assert time.monotonic() - start < 10
    assert record['status'] == 'error'
    assert record['error'].startswith('timed out after 0 s (the hard limit')


def test_sync_batch_norm_variant_runs_on_gpus_only():
    on_gpu = make_cases(['ufo-vit-small', 'ufo-vit-small+syncbn'], [], ['float32'],
                        [(64, 64)], ['train'])
    on_cpu = make_cases(['ufo-vit-small', 'ufo-vit-small+syncbn'], [], ['float32'],
                        [(64, 64)], ['train'], device_type='cpu')
    assert [c.backbone for c in on_gpu] == ['ufo-vit-small', 'ufo-vit-small+syncbn']
    assert [c.backbone for c in on_cpu] == ['ufo-vit-small']
    assert gpu_check.backbone_config('ufo-vit-small+syncbn') == \
        gpu_check.backbone_config('ufo-vit-small')


def test_compiled_variants_run_in_float32_at_the_first_size():
    cases = make_cases(['soft++-tiny+compiled'], ['newton'], ['float32', 'float16'],
                       [(64, 64), (32, 32)], ['train', 'inference'])
    assert [(c.solver, c.dtype, c.size, c.mode) for c in cases] == [
        ('newton', 'float32', (64, 64), 'train'),
        ('newton', 'float32', (64, 64), 'inference')]
    assert gpu_check.backbone_config('soft++-tiny+compiled', 'newton') == \
        gpu_check.backbone_config('soft++-tiny', 'newton')
