"""tools/analysis/benchmark.py and its package (tools/analysis/mmsoft_analysis):
the list of models, the cases and their order, one measurement in this
process on small sizes, the report's rows, ratios and targets, the budget,
the hard limit of a case's process, the profile's regions and FLOPs. The
command end to end in its CPU smoke mode: tests/test_gpu_bundle.py, where
the GPU node's check runs it."""
import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmsoft_analysis import measure, models, report, runner
from mmsoft_analysis.op_profile import (FUNCTION_REGIONS, attribute, operator_class,
                                        profile_regions, profile_tables)

REPO = Path(__file__).resolve().parents[1]


def in_process(case, timeout_s):
    """The runner's ``run`` in this process (no fresh process per case)."""
    records = []
    measure.run_case(case, records.append)
    return records


def settings(tmp_path, **changes):
    fields = dict(models=['soft++-tiny'], inputs=[[(32, 48)]], out_dir=str(tmp_path),
                  warmup=0, steps=2)
    return runner.Settings(**dict(fields, **changes))


def test_specs_name_one_model_each_with_its_origin():
    assert models.parse_spec('swin-t') == models.Spec('swin-t', 'swin-t', {})
    spec = models.parse_spec("old=soft++-tiny:root='../old',solver=newton,plain=MLP")
    assert spec.label == 'old' and spec.name == 'soft++-tiny'
    assert spec.kwargs == dict(solver='newton')
    assert spec.options['root'] == '../old'
    assert [models.origin(n) for n in ('swin-t', 'timm-swin-t', 'pvtv2-b2',
                                       'timm-pvtv2-b2', 'soft++-small')] == \
        ['mmdet', 'timm', 'mmdet', 'timm', 'mmsoft']
    for text, message in (('resnet-50', "model 'resnet-50' is not known"),
                          ('swin-t:drop', "option 'drop' of 'swin-t:drop' is invalid"),
                          ('none.py', "config 'none.py'")):
        with pytest.raises(ValueError, match=message):
            models.parse_spec(text)


def test_cases_take_turns_eager_first_then_live_and_capacity():
    chosen = settings('.', models=['a=soft++-tiny', 'b=ufo-vit-small'], rounds=2,
                      compile='inductor', live_memory=True, capacity=(64, 64))
    cases = runner.make_cases(chosen)
    assert [(c['label'], c['round'], c['compile'], c['live'], c['capacity'])
            for c in cases] == [
        ('a', 0, None, False, False), ('b', 0, None, False, False),
        ('b', 1, None, False, False), ('a', 1, None, False, False),
        ('a', 0, 'inductor', False, False), ('b', 0, 'inductor', False, False),
        ('b', 1, 'inductor', False, False), ('a', 1, 'inductor', False, False),
        ('a', 0, None, True, False), ('b', 0, None, True, False),
        ('a', 0, None, False, True), ('b', 0, None, False, True)]
    assert cases[0]['settings'] == [('train', 'float32'), ('inference', 'float32')]
    assert cases[-1]['shapes'] == [(64, 64)]


@pytest.mark.parametrize('changes, message', [
    (dict(models=['nope']), "model 'nope' is not known"),
    (dict(modes=['predict']), r"modes=\['predict'\] are invalid"),
    (dict(precisions=[]), r'precisions=\[\] are invalid'),
    (dict(steps=0), 'steps=0 is invalid; expected an integer >= 1')])
def test_settings_are_checked(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        settings(tmp_path, **changes)


def test_a_run_in_process_measures_profiles_and_reports(tmp_path):
    """Two variants of SOFT++-tiny in turns (an A/B), a padded batch with
    valid regions, training and inference, the profile by region."""
    chosen = settings(tmp_path, models=['new=soft++-tiny', 'plain=soft++-tiny:'
                                        'memory_efficient=False'],
                      inputs=[[(32, 48), (32, 32)]], pad=32, rounds=2, regions=True,
                      memory=True, steps=1)
    data = runner.run_benchmark(chosen, log=lambda line: None, run=in_process)
    assert [r['status'] for r in data['records']] == ['ok'] * 8
    assert all(len(r['times_ms']) == 1 and r['peak_mib'] >= 0
               for r in data['records'])
    rows = {(r['label'], r['mode']): r for r in data['rows']}
    assert len(rows) == 4 and all(r['rounds'] == 2 for r in rows.values())
    assert rows['new', 'train']['vs_first'] == 1.0
    train = [r for r in data['records'] if r['mode'] == 'train']
    first = [r for r in train if r['label'] == 'new']
    mine = [r for r in train if r['label'] == 'plain']
    assert len(mine) == len(first) == 2
    expected = sorted(report._median(m['times_ms']) / report._median(f['times_ms'])
                      for m, f in zip(sorted(mine, key=lambda r: r['round']),
                                      sorted(first, key=lambda r: r['round'])))
    assert sorted(rows['plain', 'train']['round_ratios']) == pytest.approx(expected)
    regions = rows['new', 'train']['regions']
    for name in ('stem and patch embedding', 'Gaussian kernel', 'kernel inverse'):
        assert regions[name]['ms'] > 0, name
    assert rows['new', 'train']['classes']['matrix products']['gflop'] > 0
    text = (tmp_path / 'results.md').read_text()
    assert '| new | train | float32 |' in text and '### By region: train' in text
    written = json.loads((tmp_path / 'results.json').read_text())
    assert written['rows'][0]['label'] == 'new'


def test_targets_come_from_the_rows():
    rows = [dict(label=label, mode='train', compiled=None, detector=False, input='x',
                 precision='amp', median_ms=ms, kernels=k, busy_share=busy,
                 max_allocated_mib=mem)
            for label, ms, k, busy, mem in (('soft++-tiny', 90., 3000., 0.7, 400.),
                                            ('timm-swin-t', 100., 1000., 0.9, 1000.))]
    found = {t['target'].split(',')[2].split()[0]: t
             for t in report.evaluate_targets(rows)}
    assert found['median_ms']['value'] == pytest.approx(0.9)
    assert found['median_ms']['status'] == 'met'
    assert (found['kernels']['value'], found['kernels']['status']) == (3., 'missed')
    assert (found['busy_share']['value'], found['busy_share']['status']) == \
        (0.7, 'missed')
    assert found['max_allocated_mib']['status'] == 'met'
    assert 'timm-swin-t: 100.0 ms' in found['median_ms']['numbers']


def test_budget_skips_the_rest_saying_why(tmp_path):
    ticks = iter(range(0, 1000, 30))
    ran = []
    chosen = settings(tmp_path, models=['soft++-tiny', 'ufo-vit-small', 'soft++-small'],
                      budget_s=50)
    data = runner.run_benchmark(
        chosen, log=lambda line: None, clock=lambda: next(ticks),
        run=lambda case, timeout: ran.append(timeout) or [runner.skipped(
            case, m, p, 'ok', times_ms=[1.]) for m, p in case['settings']])
    assert len(ran) == 1 and ran[0] == pytest.approx(20)
    assert [r['status'] for r in data['records']] == ['ok'] * 2 + ['skipped'] * 4
    assert data['records'][-1]['note'] == 'the budget was spent'


def test_a_case_past_its_hard_limit_is_killed(tmp_path):
    case = runner.make_cases(settings(tmp_path))[0]
    began = time.monotonic()
    records = runner.run_case(case, 0.5)
    assert time.monotonic() - began < 30
    assert [r['error'] for r in records] == ['timed out after 0 s'] * 2


def test_root_measures_that_checkouts_mmsoft(tmp_path):
    """``root=PATH`` imports PATH's mmsoft in the measuring process: one that
    fails to import fails its case with its error; a folder without mmsoft
    is refused, not measured with this checkout's."""
    broken = tmp_path / 'broken' / 'mmsoft'
    broken.mkdir(parents=True)
    (broken / '__init__.py').write_text("raise ImportError('the older checkout')\n")
    (tmp_path / 'empty').mkdir()
    chosen = settings(tmp_path, modes=['inference'], models=[
        f"old=soft++-tiny:root='{tmp_path / 'broken'}'",
        f"none=soft++-tiny:root='{tmp_path / 'empty'}'"])
    errors = {case['label']: [r['error'] for r in runner.run_case(case, 120)]
              for case in runner.make_cases(chosen)}
    assert ['the older checkout' in e for e in errors['old']] == [True]
    assert errors['none'] == [f"build failed: RuntimeError: mmsoft was imported from "
                              f"{REPO / 'mmsoft' / '__init__.py'}, not from "
                              f"root={tmp_path / 'empty'}."]


def test_the_tests_run_first_and_are_counted(tmp_path):
    tests = tmp_path / 'test_x.py'
    tests.write_text('import pytest\ndef test_a(): pass\ndef test_b(): assert 0\n'
                     "@pytest.mark.skip\ndef test_c(): pass\n")
    outcome = runner.run_tests([str(tests)], 120)
    assert (outcome['passed'], outcome['failed'], outcome['skipped']) == (1, 1, 1)
    (failed, ) = outcome['failed_tests']  # the module's name is relative to the root
    assert failed.endswith('test_x::test_b')


def test_capacity_and_measurements_arithmetic():
    assert measure.largest_batch({1: 300., 2: 500.}, 1000.) == dict(
        largest_batch=4, per_image_mib=200., fixed_mib=100.)
    with pytest.raises(ValueError, match='do not grow'):
        measure.largest_batch({1: 500., 2: 500.}, 1000.)
    tried = []
    assert measure.largest_fitting_batch(lambda b: tried.append(b) or b <= 5, 64) == \
        (5, False)
    assert tried == [1, 2, 4, 8, 6, 5]
    assert measure.largest_fitting_batch(lambda b: True, 3) == (3, True)
    assert measure.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert measure.activity_kind('void gemm<>', True) == 'kernel'
    assert measure.activity_kind('Memcpy HtoD', True) == 'copy'
    assert measure.activity_kind('cudaLaunchKernel', False) == 'launch'
    assert measure.activity_kind('x', True, 'gpu_user_annotation') is None
    assert measure.canvas([(800, 1199), (800, 1067)], 32) == (800, 1216)


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CUDA device is present')
def test_refuses_cuda_without_a_gpu(tmp_path, capsys):
    tool = pytest.importorskip('tests.helpers.tools').load_tool('analysis/benchmark')
    assert tool.main(['--device', 'cuda', '--out-dir', str(tmp_path)]) == 2
    assert 'needs a CUDA device' in capsys.readouterr().err
    assert not (tmp_path / 'results.json').exists()


class Mlp(nn.Sequential):
    """Named as timm's MLP: the region 'MLP'."""


@pytest.mark.parametrize('mode, passes', [('inference', 1), ('train', 3)])
def test_profile_flops_of_matrix_products(mode, passes):
    """Forward: 2 N (16 x 32 + 32 x 8); training adds each Linear's backward
    but the first one's input gradient."""
    model = Mlp(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(10, 16)
    step = measure.make_step(model, lambda m: m(x).sum(), lambda m: m(x), mode, None,
                             torch.device('cpu'))
    tables = profile_tables(model, step, torch.device('cpu'))
    forward = 2 * 10 * (16 * 32 + 32 * 8)
    expected = forward if passes == 1 else 3 * forward - 2 * 10 * 16 * 32
    assert sum(e['gflop'] for e in tables['classes'].values()) * 1e9 == \
        pytest.approx(expected)
    assert tables['regions']['MLP']['gflop'] * 1e9 == pytest.approx(expected)


def test_profile_attribution_and_missing_functions(monkeypatch, capsys):
    """A backward operator counts for its forward's region; a function of
    the table that this mmsoft lacks leaves its region unnamed."""
    from torch.profiler import profile
    monkeypatch.setitem(FUNCTION_REGIONS, 'mmsoft.models.soft.no_such_function', 'x')
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with profile_regions(nn.Sequential(layer)), profile(record_shapes=True) as prof:
        layer(x).sum().backward()
    tables = attribute(prof.events())
    assert set(tables['regions']) == {'other'}
    assert tables['regions']['other']['flops'] == 3 * 2 * 4 * 8 * 8
    assert 'mmsoft.models.soft.no_such_function (not in this mmsoft)' in \
        capsys.readouterr().err
    assert operator_class('aten::addmm') == 'matrix products'
    assert operator_class('aten::_linalg_eigh') == 'linear algebra'


@pytest.mark.torchvision  # timm
@pytest.mark.parametrize('name', ['timm-swin-t', 'timm-pvtv2-b2', 'pvtv2-b2-li'])
def test_timm_peers_give_four_maps_at_strides_4_to_32(name):
    backbone = models.build_backbone(name)
    maps = backbone(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape[2:]) for m in maps] == [(16, 24), (8, 12), (4, 6), (2, 3)]


@pytest.mark.openmmlab
@pytest.mark.mmcv_ops  # a Mask R-CNN step
@pytest.mark.torchvision  # timm
def test_detector_steps_with_mmsoft_and_a_swapped_peer(tmp_path):
    chosen = settings(tmp_path, models=['soft++-tiny', 'timm-pvtv2-b2'], detector=True,
                      inputs=[[(64, 96), (64, 64)]], steps=1, saved_tensors=True)
    data = runner.run_benchmark(chosen, log=lambda line: None, run=in_process)
    assert [r['status'] for r in data['records']] == ['ok'] * 4, data['records']
    train = [r for r in data['records'] if r['mode'] == 'train']
    assert all({'backbone', 'neck', 'rpn_head', 'roi_head'} <= set(r['saved_mib'])
               for r in train)


@pytest.mark.skipif(torch.__version__ < '2.2', reason="torch 2.1's dynamo is slow")
def test_compiled_case_in_process(tmp_path):
    chosen = settings(tmp_path, modes=['inference'], compile='eager',
                      compiled_only=True, steps=1)
    data = runner.run_benchmark(chosen, log=lambda line: None, run=in_process)
    (row, ) = data['rows']
    assert (row['compiled'], row['status']) == ('eager', 'ok') and row['compile_s'] > 0
    text = (tmp_path / 'results.md').read_text()
    assert '## Backbones, 32x48, compiled (eager)' in text
