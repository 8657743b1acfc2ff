"""The GPU check (tools/analysis/gpu_check.py): its phases and case order,
time budget, failure handling, the capacity search, test-report parsing,
CUDA refusal, the Markdown table and, on CPU at a tiny size with OpenMMLab
hidden, the results files of its smoke mode."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmsoft_analysis import gpu_backbones, gpu_check
from mmsoft_analysis.gpu_check import (CPU_SMOKE_COMMAND, Case, CheckSettings,
                                       largest_fitting_batch, make_cases,
                                       require_device, run_benchmark, run_tests)
from mmsoft_analysis.measure import run_once

REPO = Path(__file__).resolve().parents[1]
TOOL = str(REPO / 'tools/analysis/gpu_check.py')
OPENMMLAB = ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain')
#: Makes every OpenMMLab package unimportable in a Python that imports it
#: first (as ``sitecustomize``), and in the processes that Python starts.
HIDE_OPENMMLAB = ('import sys\n'
                  f'for name in {OPENMMLAB!r}:\n'
                  '    sys.modules[name] = None\n')


def run_tool(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def settings(**changes):
    values = dict(out='unused.json', device='cpu', backbones=['soft++-tiny', 'swin-t'],
                  solvers=['newton_closed_form', 'newton', 'exact'],
                  dtypes=['float32', 'bfloat16', 'float16'],
                  sizes=[(64, 64), (32, 48)], run_tests=False)
    values.update(changes)
    return CheckSettings(**values)


def test_cases_come_in_phases_most_important_first():
    cases = make_cases(settings(), device_type='cuda')
    assert [c.phase for c in cases] == (
        ['core'] * 4 + ['large'] * 4 + ['solvers'] + ['compiled'] + ['float16'] * 4 +
        ['capacity'])
    # core and large: float32 then bfloat16, every backbone; the configs'
    # solver, which on a GPU runs as 'newton' (measured once).
    assert [(c.backbone, c.solver, c.dtype, c.size) for c in cases[:4]] == [
        ('soft++-tiny', 'newton_closed_form', 'float32', (64, 64)),
        ('swin-t', None, 'float32', (64, 64)),
        ('soft++-tiny', 'newton_closed_form', 'bfloat16', (64, 64)),
        ('swin-t', None, 'bfloat16', (64, 64))]
    assert {c.size for c in cases[4:8]} == {(32, 48)}
    assert cases[8].solver == 'exact' and cases[8].dtype == 'float32'
    assert (cases[9].backbone, cases[9].solver, cases[9].compiled) == (
        'soft++-tiny', 'newton', True)
    assert {c.dtype for c in cases[10:14]} == {'float16'}
    assert [(c.backbone, c.modes, c.dtype) for c in cases[14:]] == [
        ('swin-t', ('train', ), 'float32')]
    # The sync debug mode once per model: its first case.
    assert [c.label() for c in cases if c.sync_debug] == [
        'soft++-tiny/newton_closed_form float32 64x64 train inference',
        'swin-t float32 64x64 train inference',
        'soft++-tiny/exact float32 64x64 train inference']
    assert all(c.modes == ('train', 'inference') for c in cases[:14])


def test_capacity_and_compiled_phases_take_their_backbones():
    cases = make_cases(settings(backbones=['ufo-vit-small', 'soft++-small', 'swin-t',
                                           'xcit-s12'], dtypes=['float32'],
                                phases=['compiled', 'capacity'], device='cuda'),
                       device_type='cuda')
    assert [(c.phase, c.backbone) for c in cases] == [
        ('compiled', 'ufo-vit-small'), ('capacity', 'ufo-vit-small'),
        ('capacity', 'soft++-small'), ('capacity', 'swin-t')]
    assert all(c.size == (1024, 1024) for c in cases if c.phase == 'capacity')
    on_cpu = CheckSettings(device='cpu', sizes=[(64, 64)])
    assert (on_cpu.capacity_size, on_cpu.capacity_max_batch,
            on_cpu.compile_backend) == ((64, 64), 2, 'eager')
    on_gpu = CheckSettings(device='cuda')
    assert (on_gpu.capacity_size, on_gpu.capacity_max_batch,
            on_gpu.compile_backend) == ((1024, 1024), 512, 'inductor')
    assert on_gpu.markdown == 'work_dirs/gpu_check/gpu_check.md'


def test_phase_lists_name_known_backbones():
    for phase, names in (('compiled', gpu_check.COMPILED_BACKBONES),
                         ('capacity', gpu_check.CAPACITY_BACKBONES)):
        assert gpu_check.phase_backbones(phase, names, gpu_backbones.BACKBONES) \
            == list(names)
    assert gpu_check.CAPACITY_REFERENCE in gpu_check.CAPACITY_BACKBONES
    assert set(gpu_backbones.DEFAULT_BACKBONES) <= set(gpu_backbones.BACKBONES)
    assert gpu_check.phase_backbones('capacity', ['swin-t', 'ufo-vit-small'],
                                     ['ufo-vit-small']) == ['ufo-vit-small']
    with pytest.raises(ValueError, match=r"the 'compiled' phase names backbones "
                       r"\['soft-tiny'\] that are not known; expected .*"
                       r"'soft\+\+-tiny'"):
        gpu_check.phase_backbones('compiled', ['soft-tiny', 'ufo-vit-small'],
                                  ['ufo-vit-small'])


def test_the_cpu_keeps_the_closed_form_apart_from_the_iteration():
    cases = make_cases(settings(backbones=['soft++-tiny'], dtypes=['float32'],
                                sizes=[(64, 64)], phases=['core', 'solvers']),
                       device_type='cpu')
    assert [c.solver for c in cases] == ['newton_closed_form', 'newton', 'exact']
    assert 'runs the Newton iteration itself' in gpu_check.solver_note(
        ['newton_closed_form'], 'cuda')
    assert 'closed form' in gpu_check.solver_note(['newton_closed_form'], 'cpu')


def test_settings_are_checked():
    with pytest.raises(ValueError, match='repeats=0 is invalid'):
        CheckSettings(repeats=0)
    with pytest.raises(ValueError, match='budget_s=-1 is invalid'):
        CheckSettings(budget_s=-1)
    with pytest.raises(ValueError, match="backbone='resnet-50' is not supported"):
        CheckSettings(backbones=['resnet-50'])
    with pytest.raises(ValueError, match="solver='lu' is not supported"):
        CheckSettings(solvers=['lu'])
    with pytest.raises(ValueError, match="device type='mps' is not supported"):
        require_device('mps')
    # The tool's --sizes parser is mmsoft's (tests/test_sizes.py).
    assert gpu_check.parse_size('64') == (64, 64)
    with pytest.raises(ValueError, match=r'expected HxW \(or N for NxN\)'):
        gpu_check.parse_size('800x')


class FakeClock:
    """Time that passes only when a measurement runs."""

    def __init__(self):
        self.now = 0.

    def __call__(self):
        return self.now


def test_budget_skips_the_rest_and_failures_do_not_stop_it(monkeypatch):
    clock, builds = FakeClock(), []

    def build(name, solver=None):
        builds.append((name, solver))
        if name == 'pvtv2-b2':
            raise KeyError('no PVTv2 here')
        return gpu_backbones.BackboneMaps(nn.Identity(), takes_valid_shapes=False)

    def measure(model, case, mode, device, warmup, repeats):
        clock.now += 10.  # each measurement takes 10 s
        if mode == 'inference' and case.backbone == 'soft++-tiny':
            raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried 2 GiB')
        return dict(time_ms=5., images_per_s=400.)

    monkeypatch.setattr(gpu_check, 'build_maps', build)
    monkeypatch.setattr(gpu_check, 'measure_mode', measure)
    monkeypatch.setattr(gpu_check, 'unavailable_reason',
                        lambda name: 'xcit is missing' if name == 'xcit-s12' else None)
    cases = make_cases(settings(backbones=['pvtv2-b2', 'xcit-s12', 'soft++-tiny',
                                           'ufo-vit-small'],
                                solvers=['newton'], dtypes=['float32'],
                                sizes=[(64, 64)], phases=['core']), 'cpu')
    seen = []
    records = run_benchmark(cases, torch.device('cpu'), budget_s=25.,
                            on_record=seen.append, clock=clock,
                            case_timeout_s=None)  # in this process
    assert seen == records and len(records) == 8
    assert [(r['backbone'], r['mode'], r['status']) for r in records] == [
        ('pvtv2-b2', 'train', 'error'), ('pvtv2-b2', 'inference', 'error'),
        ('xcit-s12', 'train', 'skipped'), ('xcit-s12', 'inference', 'skipped'),
        ('soft++-tiny', 'train', 'ok'), ('soft++-tiny', 'inference', 'error'),
        ('ufo-vit-small', 'train', 'ok'), ('ufo-vit-small', 'inference', 'ok')]
    assert records[0]['error'] == "build failed: KeyError: 'no PVTv2 here'"
    assert records[2]['note'] == 'xcit is missing'
    assert records[5]['error'] == 'OutOfMemoryError: CUDA out of memory. Tried 2 GiB'
    assert records[4]['solver'] == 'newton' and records[4]['valid_regions']
    assert not records[0]['valid_regions'] and records[0]['source'] == 'timm'
    assert builds == [('pvtv2-b2', None), ('soft++-tiny', 'newton'),
                      ('ufo-vit-small', None)]
    # Spent after 30 s: the rest is skipped.
    clock.now = 0.
    records = run_benchmark(cases, torch.device('cpu'), budget_s=15., clock=clock,
                            case_timeout_s=None)
    assert [r['status'] for r in records[4:]] == ['ok', 'error', 'skipped', 'skipped']
    assert records[-1]['note'] == 'the budget was spent'
    summary = gpu_check.summarise(records)
    assert (summary['ok'], summary['error'], summary['skipped']) == (1, 3, 4)
    assert summary['failed_cases'][-1] == 'soft++-tiny/newton float32 64x64 inference'


def test_largest_fitting_batch_doubles_then_bisects():
    tried = []

    def fits_up_to(limit):
        def fits(batch):
            tried.append(batch)
            return batch <= limit
        return fits

    assert largest_fitting_batch(fits_up_to(13), 512) == (13, False)
    assert tried == [1, 2, 4, 8, 16, 12, 14, 13]
    tried.clear()
    assert largest_fitting_batch(fits_up_to(100), 6) == (6, True)
    assert tried == [1, 2, 4, 6]
    assert largest_fitting_batch(fits_up_to(0), 8) == (0, False)
    assert largest_fitting_batch(fits_up_to(1), 8) == (1, False)


def test_capacity_search_on_the_cpu_runs_training_steps():
    case = Case('capacity', 'soft++-tiny', 'newton', 'float32', (64, 64), ('train', ))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = gpu_check.run_capacity(case, torch.device('cpu'), cap_gib=16.,
                                        max_batch=2)
    finally:
        torch.set_num_threads(threads)
    assert record['status'] == 'ok', record
    assert (record['largest_batch'], record['limit_reached'], record['cap_enforced']) \
        == (2, True, False)
    assert [(p['batch'], p['fits']) for p in record['probes']] == [(1, True), (2, True)]
    assert all(p['time_ms'] > 0 for p in record['probes'])


def test_host_syncs_fail_the_check_for_mmsoft_backbones_only():
    def record(backbone, solver, sync):
        return Case('core', backbone, solver, 'float32', (64, 64),
                    ('train', )).record('train', 'ok', host_sync=sync)

    sync = 'RuntimeError: called a synchronizing CUDA operation'
    records = [record('soft++-tiny', 'newton', 'none'),
               record('soft++-tiny', 'exact', sync), record('swin-t', None, sync)]
    data = dict(tests=dict(ran=False), summary=gpu_check.summarise(records))
    assert data['summary']['host_sync_cases'] == [] and gpu_check.check_passed(data)
    records.append(record('ufo-vit-small', None, sync))
    data['summary'] = gpu_check.summarise(records)
    assert data['summary']['host_sync_cases'] == ['ufo-vit-small float32 64x64 train']
    assert not gpu_check.check_passed(data)


def test_markdown_lists_every_record_and_the_capacity():
    core = Case('core', 'soft++-tiny', 'newton_closed_form', 'bfloat16', (800, 1333),
                ('train', ))
    records = [core.record('train', 'ok', solver_runs='newton', time_ms=120.,
                           images_per_s=16.7, max_memory_mib=2048., host_sync='none'),
               core.record('inference', 'skipped', note='the budget was spent')]
    for name, batch in (('ufo-vit-small', 24), ('swin-t', 6)):
        capacity = Case('capacity', name, None, 'float32', (1024, 1024), ('train', ))
        records.append(capacity.capacity_record(
            'ok', largest_batch=batch, limit_reached=False, cap_mib=16384.,
            cap_enforced=True, probes=[dict(batch=batch, fits=True),
                                       dict(batch=batch + 1, fits=False)]))
    data = dict(meta=dict(device='cuda', device_name='H200', torch='2.11', batch=2,
                          repeats=3, warmup=1, budget_s=300),
                tests=dict(ran=False), records=records,
                summary=gpu_check.summarise(records))
    text = gpu_check.format_markdown(data)
    assert ('| core | soft++-tiny | newton_closed_form (runs newton) | bfloat16 | '
            '800x1333 | train | 120.0 | 16.7 | 2048 | none | ok |') in text
    assert '| inference | - | - | - | - | skipped: the budget was spent |' in text
    assert ('| ufo-vit-small | float32 | 1024x1024 | 16384 | 24 | 4.00 | 24, 25 (no) '
            '| ok |') in text
    assert data['summary']['capacity_vs_swin-t'] == {'ufo-vit-small': 4.}


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
    assert len(outcome['failed_tests']) == 1
    assert outcome['failed_tests'][0].endswith('test_outcomes::test_fails')
    assert '1 failed, 1 passed, 1 skipped' in outcome['output_tail']
    assert gpu_check.describe_tests(outcome).startswith(
        'tests: 1 passed, 1 failed, 0 errors, 1 skipped in ')


def test_a_case_past_its_hard_limit_is_killed():
    case = Case('core', 'soft++-tiny', 'newton', 'float32', (64, 64),
                ('train', 'inference'))
    start = time.monotonic()
    records = gpu_check.measure_in_subprocess(case, torch.device('cpu'), 0, 1,
                                              timeout_s=0.5, compile_backend='eager')
    assert time.monotonic() - start < 10
    assert [(r['mode'], r['status']) for r in records] == [('train', 'error'),
                                                          ('inference', 'error')]
    assert records[0]['error'].startswith('timed out after 0 s (the hard limit')


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


def test_peers_without_timm_are_skipped_saying_why(monkeypatch):
    monkeypatch.setattr(gpu_backbones, '_import_problem',
                        lambda module: 'ModuleNotFoundError: No module named '
                        f"'{module}'")
    reason = gpu_backbones.unavailable_reason('swin-t')
    assert reason.startswith('timm is not usable here (ModuleNotFoundError')
    assert 'mmdet-swin-t' in reason
    assert gpu_backbones.unavailable_reason('ufo-vit-small') is None
    with pytest.raises(RuntimeError, match='timm is not usable here'):
        gpu_backbones.build_maps('xcit-s12')


@pytest.mark.torchvision  # timm
def test_timm_peers_give_four_maps_at_any_size():
    pytest.importorskip('timm')
    images = torch.randn(1, 3, 72, 100)  # sides not multiples of 32
    for name in ('swin-t', 'xcit-s12'):
        maps = gpu_backbones.build_maps(name).eval()
        assert not maps.takes_valid_shapes
        with torch.no_grad():
            outs = maps(images)
        shapes = [tuple(o.shape[1:3]) if name == 'swin-t' else tuple(o.shape[2:])
                  for o in outs]  # timm's Swin gives NHWC maps
        assert shapes == ([(18, 25), (9, 13), (5, 7), (3, 4)] if name == 'swin-t'
                          else [(20, 28), (10, 14), (5, 7), (3, 4)]), name


def hidden_openmmlab_env(tmp_path):
    """The environment of a Python that cannot import OpenMMLab."""
    folder = tmp_path / 'hide_openmmlab'
    folder.mkdir()
    (folder / 'sitecustomize.py').write_text(HIDE_OPENMMLAB)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['PYTHONPATH'] = str(folder)
    return env


def test_cpu_smoke_run_without_openmmlab_writes_json_and_markdown(tmp_path):
    """The smoke mode end to end in this Python, OpenMMLab hidden: one
    backbone of each family (SOFT++, UFO-ViT, a timm peer, skipped where
    timm is missing), each case in its own process, then the capacity
    search."""
    out = tmp_path / 'check' / 'gpu_check.json'
    table = tmp_path / 'check' / 'table.md'
    done = run_tool('--device', 'cpu', '--sizes', '64x64', '--repeats', '1',
                    '--warmup', '0', '--skip-tests', '--backbones', 'soft++-tiny',
                    'ufo-vit-small', 'pvtv2-b2', '--dtypes', 'float32',
                    '--phases', 'core', 'capacity', '--out', str(out),
                    '--markdown', str(table), timeout=240,
                    env=hidden_openmmlab_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    meta = data['meta']
    assert meta['device'] == 'cpu' and meta['torch'] == torch.__version__
    assert meta['cases'] == 4 and meta['cpu_threads'] == 1
    assert data['tests'] == {'ran': False}
    records = data['records']
    timm_missing = gpu_backbones.unavailable_reason('pvtv2-b2')
    expected = [(b, m) for b in ('soft++-tiny', 'ufo-vit-small', 'pvtv2-b2')
                for m in ('train', 'inference')] + [('ufo-vit-small', 'capacity')]
    assert [(r['backbone'], r['mode']) for r in records] == expected
    for record in records:
        if record['backbone'] == 'pvtv2-b2' and timm_missing:
            assert record['status'] == 'skipped', record
            assert record['note'].startswith('timm is not usable here')
            continue
        assert record['status'] == 'ok' and record['error'] is None, record
        assert record['max_memory_mib'] is None and record['host_sync'] is None
        if record['mode'] != 'capacity':
            assert record['time_ms'] > 0 and record['images_per_s'] > 0
    params = {r['backbone']: r['params_m'] for r in records if r['params_m']}
    assert 10 < params['soft++-tiny'] < 15
    if not timm_missing:
        assert 20 < params['pvtv2-b2'] < 30
    markdown = table.read_text()
    assert markdown.startswith('# GPU check')
    assert '| core | soft++-tiny | newton_closed_form | float32 | 64x64 | train |' \
        in markdown
    assert 'Largest training batch within the memory cap' in markdown
    assert 'newton_closed_form' in data['meta']['solvers_on_device']


def test_spent_budget_lists_every_case_as_skipped(tmp_path):
    out = tmp_path / 'gpu_check.json'
    done = run_tool('--device', 'cpu', '--sizes', '64x64', '32x32', '--budget-s',
                    '0', '--backbones', 'soft++-tiny', 'ufo-vit-small', '--solvers',
                    'newton', '--dtypes', 'float32', '--phases', 'core', 'large',
                    '--skip-tests', '--out', str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert [(r['status'], r['time_ms']) for r in data['records']] == [
        ('skipped', None)] * 8
    assert data['summary']['skipped_cases'][-1] == \
        'ufo-vit-small float32 32x32 inference'
    assert '0 measured, 0 failed, 8 skipped (budget 0 s)' in done.stdout
    markdown = (tmp_path / 'gpu_check.md').read_text()
    assert markdown.count('skipped: the budget was spent') == 8
