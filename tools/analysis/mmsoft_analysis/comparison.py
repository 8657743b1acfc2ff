"""Accuracy against cost: the backbones that ``tools/analysis/compare_backbones.py``
trains side by side on the demo data, their runs, costs and report
(docs/comparison.md).
"""
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import REPO
from .report import table_lines


@dataclass(frozen=True)
class Entry:
    """One backbone: its short ``name`` (tables, plots), ``config``, the
    ``source`` of its code, the ``group`` of similar parameter count it is
    read within, and its training ``recipe`` (a key of :data:`RECIPES`)."""
    name: str
    config: str
    source: str
    group: str
    recipe: str = 'shared'

    @property
    def ours(self) -> bool:
        """Whether the backbone is one of mmsoft's."""
        return self.source == 'mmsoft'


def _entries(template: str, rows: Sequence[tuple]) -> List[Entry]:
    """``rows`` (name, config, source, group[, recipe]) as entries, each config
    put into ``template``."""
    return [Entry(name, f"configs/{'demo' if source == 'mmsoft' else 'comparison'}/"
                  f'{template.format(config)}.py', source, *rest)
            for name, config, source, *rest in rows]


# The shared recipe (the demo's) and the probe's alternatives: AdamW's ``lr``
# and the warm-up in epochs (docs/comparison.md, "The probe").
RECIPES: Dict[str, Dict[str, float]] = {
    'shared': {},
    'warmup-1-epoch': dict(warmup_epochs=1),
    'lr-3e-4-warmup-1-epoch': dict(lr=3e-4, warmup_epochs=1),
}


# The groups, by the backbone's parameter count; the largest are references.
SMALL, MEDIUM, LARGE = '3-7 M', '11-14 M', '22-24 M'
GROUP_PARAMS = {SMALL: (3e6, 7e6), MEDIUM: (11e6, 14e6), LARGE: (22e6, 24e6)}
MASK_RCNN = 'mask-rcnn_{}_fpn_demo'
DETECTORS: List[Entry] = _entries(MASK_RCNN, [
    ('SOFT++ half-width (demo)', 'soft-tiny', 'mmsoft', SMALL),
    ('UFO-ViT-tiny', 'ufo-vit-tiny', 'mmsoft', SMALL),
    ('PVTv2-b0', 'pvtv2-b0', 'mmdet', SMALL),
    ('XCiT-T12', 'xcit-t12', 'timm', SMALL),
    ('SOFT++-tiny', 'soft++-tiny', 'mmsoft', MEDIUM),
    ('ResNet-18', 'r18', 'mmdet', MEDIUM),
    # The recipes below are the probe's best (seed 0, full run); neither
    # makes the backbone learn (docs/comparison.md, "The probe").
    ('Swin (64 channels, window 5)', 'swin-64', 'mmdet', MEDIUM,
     'lr-3e-4-warmup-1-epoch'),
    ('PVTv2-b1', 'pvtv2-b1', 'mmdet', MEDIUM),
    ('ResNet-50', 'r50', 'mmdet', LARGE),
    ('PVTv2-b2-li', 'pvtv2-b2-li', 'timm', LARGE, 'warmup-1-epoch'),
])
SEGMENTORS: List[Entry] = _entries('upernet_{}_demo', [
    ('SOFT++ half-width (demo)', 'soft-tiny', 'mmsoft', SMALL),
    ('UFO-ViT-tiny', 'ufo-vit-tiny', 'mmsoft', SMALL),
    ('PVTv2-b0', 'pvtv2-b0', 'mmdet', SMALL),
    ('ResNet-18', 'r18', 'mmseg', MEDIUM),
])
# The probe: each recipe for the two backbones that did not learn under the
# shared recipe (those given another), and for mmdet's PVTv2 at PVTv2-b2-li's
# depths (a control for timm's implementation).
[PROBE_CONTROL] = _entries(MASK_RCNN, [('PVTv2-b2 (control)', 'pvtv2-b2', 'mmdet',
                                        LARGE)])
PROBE_DETECTORS: List[Entry] = [
    *[entry for entry in DETECTORS if entry.recipe != 'shared'], PROBE_CONTROL]
# The demo configs' schedules: Mask R-CNN's (epochs), UperNet's (iterations).
DEMO_EPOCHS, DEMO_EPOCH_ITERS, DEMO_DET_WARMUP = 8, 75, 100
DEMO_SEG_ITERS, DEMO_SEG_WARMUP = 1100, 50
BBOX_METRIC, SEGM_METRIC, MIOU_METRIC = 'coco/bbox_mAP', 'coco/segm_mAP', 'mIoU'
#: ``--cfg-options`` that stop a compressed run after its first epoch and
#: validate there; the rest (so the learning rate at each step) is the full
#: run's, which continues from the probe's checkpoint with ``--resume``.
PROBE_OPTIONS = ['train_cfg.max_epochs=1', 'train_cfg.val_interval=1']
#: The metrics of each task's runs.
METRICS = dict(detection=(BBOX_METRIC, SEGM_METRIC), probe=(BBOX_METRIC, SEGM_METRIC),
               segmentation=(MIOU_METRIC, ))


def _warmup(name: str, value: int, limit: int, warmup: int) -> int:
    """The demo's ``warmup`` for its schedule of ``limit`` epochs (iterations)
    compressed to ``value``, rounded up; a ValueError unless 1 to ``limit``."""
    if not 1 <= value <= limit:
        raise ValueError(f'{name} must be between 1 and {limit} (the demo '
                         f'schedule); got {value}.')
    return math.ceil(warmup * value / limit)


def detection_schedule(epochs: int) -> List[str]:
    """``--cfg-options`` that compress the Mask R-CNN demo schedule to
    ``epochs`` (a ValueError unless 1 to 8): the warm-up keeps its share,
    validation runs once, at the end, and one checkpoint is kept."""
    warmup = _warmup('epochs', epochs, DEMO_EPOCHS, DEMO_DET_WARMUP)
    return [f'train_cfg.max_epochs={epochs}', f'train_cfg.val_interval={epochs}',
            f'param_scheduler.0.end={warmup}', f'param_scheduler.1.end={epochs}',
            f'param_scheduler.1.T_max={epochs}',
            'default_hooks.checkpoint.max_keep_ckpts=1']


def recipe_options(recipe: str, epochs: int) -> List[str]:
    """``--cfg-options`` that apply ``recipe`` (a key of :data:`RECIPES`, else
    a ValueError) to the Mask R-CNN schedule compressed to ``epochs``."""
    if recipe not in RECIPES:
        raise ValueError(f'recipe {recipe!r} is not known; expected one of '
                         f'{list(RECIPES)}.')
    lr, warmup = RECIPES[recipe].get('lr'), RECIPES[recipe].get('warmup_epochs')
    options = [] if lr is None else [f'optim_wrapper.optimizer.lr={lr}']
    if warmup is not None:
        iters = min(math.ceil(warmup * DEMO_EPOCH_ITERS), epochs * DEMO_EPOCH_ITERS)
        options.append(f'param_scheduler.0.end={iters}')
    return options


def segmentation_schedule(iters: int) -> List[str]:
    """The same for the UperNet demo schedule, to ``iters`` iterations (a
    ValueError unless 1 to 1100)."""
    warmup = _warmup('iters', iters, DEMO_SEG_ITERS, DEMO_SEG_WARMUP)
    return [f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            f'param_scheduler.0.end={warmup}', f'param_scheduler.1.begin={warmup}',
            f'param_scheduler.1.end={iters}',
            f'default_hooks.checkpoint.interval={iters}',
            'default_hooks.checkpoint.max_keep_ckpts=1']


def _records(work_dir: Path):
    """Every JSON line that mmengine's ``LocalVisBackend`` logged for the run
    in ``work_dir``, oldest first (a resumed run has several timestamps)."""
    for scalars in sorted(work_dir.glob('*/vis_data/scalars.json')):
        for line in scalars.read_text().splitlines():
            yield json.loads(line)


def final_metrics(work_dir: Path, keys: Sequence[str],
                  step: Optional[int] = None) -> Optional[Dict]:
    """The metrics ``keys`` and the ``step`` of the newest validation of the
    run in ``work_dir`` (at ``step``, when given), or None."""
    found = None
    for record in _records(work_dir):
        if all(key in record for key in keys) and step in (None, record.get('step')):
            found = {key: record[key] for key in (*keys, 'step')}
    return found


def epoch_loss(work_dir: Path, epoch_iters: int, share: float = 0.4) -> Optional[float]:
    """The mean training loss over the last ``share`` of the first epoch: a
    less noisy sign of early learning than an mAP near zero."""
    first = epoch_iters * (1 - share)
    losses = [record['loss'] for record in _records(work_dir)
              if 'loss' in record and first < record['step'] <= epoch_iters]
    return sum(losses) / len(losses) if losses else None


def seed_summary(values: Sequence[float]) -> Dict:
    """Mean, minimum and maximum of one backbone's per-seed values."""
    return dict(mean=sum(values) / len(values), low=min(values),
                high=max(values), values=list(values))


# --- Training runs
#: Where each task's demo data is, and the generator's name for it.
DATASETS = dict(detection=('coco', 'data/demo_coco'), probe=('coco', 'data/demo_coco'),
                segmentation=('ade', 'data/demo_ade'))


def run_key(task: str, config: str, recipe: str, seed: int) -> str:
    """What identifies a run among the records."""
    return f'{task}:{config}:{recipe}:{seed}'


def _job(args, task: str, entry: Entry, seed: int) -> Dict:
    """One ``tools/train.py`` run of ``entry`` for ``task`` (``'probe'``: its
    first epoch), resumed where it stopped; :func:`finish` writes ``marker``."""
    if task == 'segmentation':
        schedule = segmentation_schedule(args.seg_iters)
    else:
        schedule = [*detection_schedule(args.epochs),
                    *recipe_options(entry.recipe, args.epochs),
                    *(PROBE_OPTIONS if task == 'probe' else [])]
    recipe = '' if entry.recipe == 'shared' else f'_{entry.recipe}'
    work_dir = (Path(args.work_dir) / ('detection' if task == 'probe' else task)
                / f'{Path(entry.config).stem}{recipe}_seed{seed}')
    command = [sys.executable, 'tools/train.py', entry.config, '--work-dir',
               str(work_dir), '--resume', '--cfg-options', f'randomness.seed={seed}',
               *schedule, *args.cfg_options]
    marker = 'probe.json' if task == 'probe' else 'result.json'
    return dict(task=task, entry=entry, seed=seed, work_dir=work_dir, command=command,
                marker=work_dir / marker,
                key=run_key(task, entry.config, entry.recipe, seed))


def training_jobs(args) -> List[Dict]:
    """Every (entry, seed) run of ``args.detectors`` and ``args.segmentors``,
    seed-major."""
    return [_job(args, task, entry, seed) for seed in args.seeds
            for task, entries in (('detection', args.detectors),
                                  ('segmentation', args.segmentors))
            for entry in entries]


def probe_jobs(args) -> List[Dict]:
    """The probe's runs (first seed): for each backbone of the probe and each
    recipe, the first epoch, then the full run resuming from it (``after``:
    started only once the first epoch has finished); all first epochs first."""
    entries = [replace(base, recipe=recipe) for base in PROBE_DETECTORS
               for recipe in RECIPES]
    first = [_job(args, 'probe', entry, args.seeds[0]) for entry in entries]
    return first + [dict(_job(args, 'detection', entry, job['seed']), after=job['key'])
                    for entry, job in zip(entries, first)]


def finish(job: Dict, returncode: int, seconds: float) -> Dict:
    """A finished run's result (a probe's: its first epoch's, with the
    training loss there), written to its marker file."""
    task, entry, work_dir = job['task'], job['entry'], job['work_dir']
    metrics = final_metrics(work_dir, METRICS[task], 1 if task == 'probe' else None)
    result = dict(task=task, name=entry.name, config=entry.config,
                  recipe=entry.recipe, seed=job['seed'], wall_seconds=round(seconds, 1),
                  returncode=returncode, date=time.strftime('%Y-%m-%d'))
    if returncode != 0 or metrics is None:
        return dict(result, error=f'tools/train.py exited with {returncode}; see '
                                  f"{work_dir / 'train.log'}")
    result['metrics'] = metrics
    if job.get('after'):
        result['note'] = ('wall_seconds counts the epochs after the first; the '
                          'first is the probe run of the same work dir')
    if task == 'probe':
        result['loss'] = epoch_loss(work_dir, DEMO_EPOCH_ITERS)
    job['marker'].write_text(json.dumps(result, indent=2))
    return result


def run_jobs(jobs: List[Dict], recorded: Dict[str, Dict], records: Path,
             at_once: int, threads: int) -> List[Dict]:
    """Runs and records every job that is not recorded, ``at_once`` at a
    time; a job waits for the run it resumes from (``after``) and is dropped
    when that failed. Generates missing demo data; returns the failed runs."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    pending = [job for job in jobs if job['key'] not in recorded]
    for kind, root in dict.fromkeys(DATASETS[job['task']] for job in pending):
        if not (REPO / root).exists():
            subprocess.run([sys.executable, 'tools/generate_demo_data.py', kind],
                           cwd=REPO, check=True)
    running, failed, total = [], [], len(pending)
    while pending or running:
        failed_keys = {result['key'] for result in failed}
        for job in [job for job in pending if job.get('after') in failed_keys]:
            pending.remove(job)
            failed.append(dict(key=job['key'], name=job['entry'].name, seed=job['seed'],
                               error='its first epoch failed'))
        ready = [job for job in pending if job.get('after') in (None, *recorded)]
        if pending and not ready and not running:
            raise RuntimeError('runs wait for runs that are not scheduled: '
                               f"{[job['after'] for job in pending]}")
        for job in ready[:at_once - len(running)]:
            pending.remove(job)
            job['work_dir'].mkdir(parents=True, exist_ok=True)
            # The child writes to its own copy of the log file's descriptor.
            with open(job['work_dir'] / 'train.log', 'a') as log:
                job['process'] = subprocess.Popen(job['command'], cwd=REPO, env=env,
                                                  stdout=log, stderr=subprocess.STDOUT)
            job['start'] = time.time()
            running.append(job)
            print(f"[{total - len(pending)}/{total}] training {job['entry'].name} "
                  f"({job['task']}, recipe {job['entry'].recipe}, seed {job['seed']}) "
                  f"in {job['work_dir']}", flush=True)
        time.sleep(5)
        for job in [job for job in running if job['process'].poll() is not None]:
            running.remove(job)
            result = finish(job, job['process'].returncode, time.time() - job['start'])
            if 'error' in result:
                failed.append(dict(result, key=job['key']))
                print(f"failed: {job['entry'].name} seed {job['seed']}: "
                      f"{result['error']}", flush=True)
            else:
                recorded[job['key']] = result
                save_records(records, recorded)
                print(f"done: {job['entry'].name} seed {job['seed']}: "
                      f"{result['metrics']} ({result['wall_seconds']:.0f} s)",
                      flush=True)
    return failed


def load_records(path: Path, jobs: Sequence[Dict] = ()) -> Dict[str, Dict]:
    """The recorded runs (``runs.json``) by :func:`run_key`, updated by the
    results of ``jobs`` finished in their work dirs."""
    recorded = {} if not path.exists() else {
        run_key(r['task'], r['config'], r.get('recipe', 'shared'), r['seed']): r
        for r in json.loads(path.read_text())}
    recorded.update({job['key']: json.loads(job['marker'].read_text())
                     for job in jobs if job['marker'].exists()})
    return recorded


def save_records(path: Path, recorded: Dict[str, Dict]) -> None:
    """Adds ``recorded`` to the records in ``path`` (another call of the tool
    may have added some since) and writes them, sorted."""
    merged = {**load_records(path), **recorded}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([merged[key] for key in sorted(merged)], indent=2)
                    + '\n')


def machine() -> Dict:
    """Where the figures come from."""
    import platform

    import torch
    return dict(processor=platform.processor() or platform.machine(),
                cpu_count=os.cpu_count(), torch=torch.__version__,
                python=platform.python_version(), date=time.strftime('%Y-%m-%d'))


# --- The report: accuracy against cost
# The benchmark spec suffix of mmsoft's backbones without the memory-efficient
# path (compare_backbones.py measures them both ways).
PLAIN = ':memory_efficient=False'


def cost_fields(entry: Entry, costs: Optional[Dict]) -> Dict:
    """The cost columns of ``entry``'s backbone from the rows of ``costs``
    (:func:`measure_costs`; None where not measured), times in CPU seconds
    (the fastest step's); the training columns again as ``*_plain``:
    mmsoft's backbones with ``memory_efficient=False``, the peers' own."""
    rows = {(kind, row['label']): row for kind, found in (costs or {}).items()
            for row in found if row['status'] == 'ok'}

    def cost(kind: str, key: str, spec: str = entry.config):
        value = rows.get((kind, spec), {}).get(key)
        return value / 1e3 if key == 'cpu_ms' and value else value

    fields = dict(params_m=cost('inference', 'params_m'),
                  gflops=cost('inference', 'gflops'),
                  gflops_small=cost('flops', 'gflops'),
                  latency_s=cost('inference', 'cpu_ms'))
    plain = entry.config + PLAIN if entry.ours else entry.config
    for suffix, spec in (('', entry.config), ('_plain', plain)):
        fields['train_iter_s' + suffix] = cost('train', 'cpu_ms', spec)
        fields['train_peak_mib' + suffix] = cost('peak', 'live_peak_mib', spec)
    return fields


def measure_costs(detectors: Sequence[Entry], sizes: Dict, threads: int,
                  work_dir: Path, run=None) -> Dict:
    """The benchmark's rows of the four runs of :func:`cost_fields` on the
    detectors' backbones, built from their configs, at ``sizes`` by run; the
    training runs with mmsoft's backbones also without the memory-efficient
    path. Written to ``work_dir/costs.json``; ``run`` measures a case."""
    from .runner import Settings, run_benchmark, run_case
    specs = [entry.config for entry in detectors]
    plain = specs + [entry.config + PLAIN for entry in detectors if entry.ours]
    runs = dict(inference=(specs, 'inference', dict(flops=True)),
                flops=(specs, 'inference', dict(flops=True, warmup=0, steps=1)),
                train=(plain, 'train', dict(steps=2)),
                peak=(plain, 'train', dict(live_memory=True, steps=0)))
    costs = {}
    for name, (models, mode, options) in runs.items():
        settings = Settings(models=models, inputs=[[tuple(sizes[name])]], modes=[mode],
                            threads=threads, case_timeout_s=1e9,
                            out_dir=str(Path(work_dir) / 'costs' / name), **options)
        costs[name] = run_benchmark(settings, run=run or run_case)['rows']
    (Path(work_dir) / 'costs.json').write_text(json.dumps(costs, indent=2))
    return costs


def _row(entry: Entry, runs: Sequence[Dict], task: str, **columns) -> Dict:
    """``entry`` with ``columns``, and each metric's :func:`seed_summary` over
    its finished runs of ``task``, with the seeds and the mean training time."""
    mine = sorted((run for run in runs if run['task'] == task
                   and run['config'] == entry.config
                   and run.get('recipe', 'shared') == entry.recipe),
                  key=lambda run: run['seed'])
    row = dict(name=entry.name, config=entry.config, source=entry.source,
               group=entry.group, ours=entry.ours, **columns,
               seeds=[run['seed'] for run in mine])
    for metric in METRICS[task]:
        values = [run['metrics'][metric] for run in mine]
        row[metric] = seed_summary(values) if values else None
    if mine:
        row['train_minutes'] = sum(run['wall_seconds'] for run in mine) / len(mine) / 60
    return row


def comparison_rows(runs: Sequence[Dict], costs: Optional[Dict],
                    detectors: Sequence[Entry],
                    segmentors: Sequence[Entry]) -> Dict[str, List[Dict]]:
    """One row per detector (recipe, costs and mAPs) and per segmentor (mIoU)."""
    return dict(detection=[_row(entry, runs, 'detection', recipe=entry.recipe,
                                **cost_fields(entry, costs)) for entry in detectors],
                segmentation=[_row(entry, runs, 'segmentation')
                              for entry in segmentors])


def _number(value: Optional[float], digits: int) -> str:
    return '–' if value is None else f'{value:,.{digits}f}'


def _metric(summary: Optional[Dict]) -> str:
    """``**mean** (v1, v2)``, or ``not run``."""
    if summary is None:
        return 'not run'
    values = ', '.join(f'{value:.3f}' for value in summary['values'])
    return f"**{summary['mean']:.3f}** ({values})"


def _link(config: str) -> str:
    """A config's file name linked from ``docs/comparison/``."""
    return f'[{os.path.basename(config)}](../../{config})'


def _sizes(settings: Dict) -> Dict[str, str]:
    """The measurement sizes, as ``'800×1333'``."""
    return {kind: size.replace('x', '×') for kind, size in settings['sizes'].items()}


def _recipe(name: str) -> str:
    """A recipe in words: ``shared (lr 1e-3, warm-up 1/6 of the run)`` or
    ``lr 3e-4, warm-up 1 epoch``."""
    recipe = RECIPES[name]
    mantissa, exponent = f"{recipe.get('lr', 1e-3):e}".split('e')
    lr = f'lr {float(mantissa):g}e{int(exponent)}'
    if 'warmup_epochs' not in recipe:
        return f'{name} ({lr}, warm-up 1/6 of the run)'
    return f"{lr}, warm-up {recipe['warmup_epochs']:g} epoch"


#: The cost columns of the detection table and their decimals.
COST_COLUMNS = (('params_m', 1), ('gflops_small', 2), ('gflops', 1), ('latency_s', 2),
                ('train_iter_s', 2), ('train_iter_s_plain', 2), ('train_peak_mib', 0),
                ('train_peak_mib_plain', 0))


def markdown_tables(rows: Dict[str, List[Dict]], settings: Dict) -> str:
    """The detection and segmentation tables, with the settings they come from."""
    machine, sizes = settings['machine'], _sizes(settings)
    lines = [
        f"Demo data, the demo schedules compressed to {settings['epochs']} "
        f"epochs (Mask R-CNN) and {settings['seg_iters']} iterations (UperNet); "
        f"seeds {', '.join(map(str, settings['seeds']))}; {settings['threads']} "
        f"thread per run; {machine['processor']}, {machine['cpu_count']} cores, "
        f"torch {machine['torch']}, report of {machine['date']}. Each run's "
        "date and wall time are in runs.json; training (min) is the mean over "
        "the seeds, under the load of the run's day, and a run resumed from "
        "the probe counts its epochs after the first. Training costs of "
        "mmsoft's backbones with the memory-efficient path and without it "
        "(plain autograd, as the peers run); the peers' figures repeat in "
        "both.", '']
    lines += table_lines(
        ['backbone', 'source', 'group', 'recipe', 'config', 'params (M)',
         f"GFLOPs {sizes['flops']}", f"GFLOPs {sizes['inference']}",
         f"inference {sizes['inference']} (CPU s)",
         f"training iteration {sizes['train']} (CPU s)", 'same, plain autograd',
         f"training peak {sizes['peak']} (MiB)", 'same, plain autograd', 'bbox mAP',
         'segm mAP', 'training (min)'],
        [[row['name'], row['source'], row['group'], _recipe(row['recipe']),
          _link(row['config']),
          *(_number(row[key], digits) for key, digits in COST_COLUMNS),
          _metric(row[BBOX_METRIC]), _metric(row[SEGM_METRIC]),
          _number(row.get('train_minutes'), 1)] for row in rows['detection']],
        right=(*range(5, 13), 15))
    lines += [''] + table_lines(
        ['backbone', 'source', 'config', 'mIoU (%)', 'training (min)'],
        [[row['name'], row['source'], _link(row['config']), _metric(row[MIOU_METRIC]),
          _number(row.get('train_minutes'), 1)] for row in rows['segmentation']],
        right=(4, ))
    return '\n'.join(lines) + '\n'


def probe_table(probes: Sequence[Dict], runs: Sequence[Dict]) -> str:
    """The probe's table: each first epoch, with the full run of the same
    recipe and seed where there is one."""
    full = {(run['config'], run.get('recipe', 'shared'), run['seed']): run
            for run in runs if run['task'] == 'detection'}
    body = []
    for run in probes:
        if run['task'] != 'probe':
            continue
        final = full.get((run['config'], run['recipe'], run['seed']), {}).get(
            'metrics', {})
        body.append([
            run['name'], _recipe(run['recipe']), f"{run['metrics'][BBOX_METRIC]:.3f}",
            f"{run['metrics'][SEGM_METRIC]:.3f}", _number(run.get('loss'), 3),
            _number(final.get(BBOX_METRIC), 3), _number(final.get(SEGM_METRIC), 3),
            f"{run['wall_seconds'] / 60:.1f}"])
    return '\n'.join(table_lines(
        ['backbone', 'recipe', 'bbox mAP, epoch 1', 'segm mAP, epoch 1',
         'training loss, last 40% of epoch 1', 'bbox mAP, full run',
         'segm mAP, full run', 'minutes, epoch 1'], body, right=range(2, 8))) + '\n'


def plot_map_against(rows: Sequence[Dict], cost: str, label: str, path: str,
                     ours_also: Optional[str] = None) -> None:
    """bbox mAP (the seeds' range as error bars) against one cost column;
    mmsoft's backbones in red, with their ``ours_also`` column as a hollow
    marker joined to the first."""
    from matplotlib.figure import Figure
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for row in rows:
        summary = row[BBOX_METRIC]
        if summary is None or row[cost] is None:
            continue
        errors = [[summary['mean'] - summary['low']],
                  [summary['high'] - summary['mean']]]
        colour, marker = ('tab:red', 'o') if row['ours'] else ('tab:blue', 's')
        axes.errorbar(row[cost], summary['mean'], yerr=errors, fmt=marker,
                      color=colour, capsize=3)
        axes.annotate(row['name'], (row[cost], summary['mean']), fontsize=7,
                      xytext=(4, 3), textcoords='offset points')
        if row['ours'] and ours_also and row.get(ours_also) is not None:
            axes.plot([row[cost], row[ours_also]], [summary['mean']] * 2, ':',
                      color=colour)
            axes.plot(row[ours_also], summary['mean'], marker, mfc='none',
                      color=colour)
    axes.margins(x=0.15)  # room for the labels of the outermost points
    axes.set(xlabel=label, ylabel='bbox mAP (demo data; bars: range over seeds)',
             title="mmsoft (red) and the libraries' backbones (blue)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_report(runs: Sequence[Dict], probes: Sequence[Dict],
                 costs: Optional[Dict], detectors: Sequence[Entry],
                 segmentors: Sequence[Entry], settings: Dict,
                 out_dir: str) -> List[str]:
    """Writes the tables, ``comparison.json`` and the two plots of the
    finished runs and probes into ``out_dir``; returns their paths. ``costs``
    (:func:`measure_costs`) None leaves the cost columns empty."""
    os.makedirs(out_dir, exist_ok=True)
    rows = comparison_rows(runs, costs, detectors, segmentors)
    texts = {'table.md': markdown_tables(rows, settings),
             'probe.md': probe_table(probes, [*runs, *probes]),
             'comparison.json': json.dumps(dict(settings=settings, **rows,
                                                probe=list(probes)), indent=2)}
    paths = [os.path.join(out_dir, name) for name in
             (*texts, 'map_vs_latency.png', 'map_vs_train_memory.png')]
    for path, text in zip(paths, texts.values()):
        with open(path, 'w') as file:
            file.write(text)
    sizes = _sizes(settings)
    plot_map_against(rows['detection'], 'latency_s',
                     f"backbone inference at {sizes['inference']} (CPU seconds, "
                     f"{settings['threads']} thread)", paths[3])
    plot_map_against(rows['detection'], 'train_peak_mib_plain',
                     f"backbone training peak at {sizes['peak']} (MiB of live "
                     "memory)\nfilled: plain autograd; hollow: mmsoft's "
                     'memory-efficient path', paths[4], ours_also='train_peak_mib')
    return paths
