"""Accuracy against cost: mmsoft's backbones and the libraries' trained side by side.

One command trains every backbone of :mod:`mmsoft_analysis.comparison` on
the demo data with the same Mask R-CNN (and, for four of them, the same
UperNet), with each seed, measures their costs with the project's benchmark
tools, and writes the table and the plots:

1. **probe**: the first epoch of the compressed Mask R-CNN schedule under
   each recipe of :data:`~mmsoft_analysis.comparison.RECIPES` (learning rate
   and warm-up) for the backbones that did not learn under the shared one
   (Swin, PVTv2-b2-li) and mmdet's PVTv2 at PVTv2-b2-li's depths as a
   control, then the full run of each, resumed from its first epoch.
2. **train**: ``tools/train.py`` per (config, seed), ``--jobs`` at a time,
   each with ``--threads`` threads, on the demo schedule compressed to
   ``--epochs`` epochs (``--seg-iters`` iterations for UperNet), under the
   entry's recipe; the final validation gives COCO bbox / segm mAP (mmdet's
   ``CocoMetric``) or mIoU.
3. **costs**: the benchmark (:mod:`mmsoft_analysis.runner`) on each
   detector's backbone, built from its config: parameters, FLOPs (mmsoft's
   handle-aware counter) at 800x1333 and at the training size (160x160),
   inference latency at 800x1333, one training step (forward and backward)
   at 800x1333, and the peak of live training memory at 1536x1536; the
   training figures of mmsoft's backbones also with ``memory_efficient=False``.
4. **report**: ``table.md``, ``probe.md``, ``comparison.json`` and the
   plots ``map_vs_latency.png`` and ``map_vs_train_memory.png`` in
   ``--out-dir`` (``docs/comparison/``; ``docs/comparison.md`` explains them).

Every finished run is recorded in ``runs.json`` beside the report and is not
run again, here or in another clone; a run finished in its work dir (a
``result.json``) is recorded at the next call; a killed run resumes from its
last checkpoint.

Example::

    python tools/analysis/compare_backbones.py            # what is not recorded yet
    python tools/analysis/compare_backbones.py --phases report
    python tools/analysis/compare_backbones.py --detectors ResNet-18 PVTv2-b0 \\
        --segmentors --epochs 1 --seeds 0 --phases train
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Sequence

from mmsoft_analysis import REPO, parse_size
from mmsoft_analysis.comparison import (BBOX_METRIC, DEMO_EPOCH_ITERS, DETECTORS,
                                        MIOU_METRIC, PLAIN, PROBE_DETECTORS, RECIPES,
                                        SEGM_METRIC, SEGMENTORS, Entry,
                                        detection_schedule, epoch_loss,
                                        final_metrics, first_epoch_metrics,
                                        measure_costs, probe_options, recipe_options,
                                        segmentation_schedule, write_report)

PHASES = ('probe', 'train', 'costs', 'report')
INFERENCE_SIZE, TRAIN_SIZE, PEAK_SIZE = (800, 1333), (800, 1333), (1536, 1536)
FLOPS_SIZE = (160, 160)
RECORDS = 'runs.json'  # every finished run, beside the report
DATASETS = dict(detection=('coco', 'data/demo_coco'),
                segmentation=('ade', 'data/demo_ade'))


def _select(entries: Sequence[Entry], names, option: str) -> List[Entry]:
    if names is None:
        return list(entries)
    known = {entry.name: entry for entry in entries}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f'{option}: {unknown} not known; expected names from '
                         f'{list(known)}.')
    return [known[name] for name in names]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--phases', nargs='+', choices=PHASES, default=list(PHASES))
    parser.add_argument('--detectors', nargs='*', metavar='NAME',
                        help='Mask R-CNN entries by name (default: all: '
                        f'{", ".join(e.name for e in DETECTORS)})')
    parser.add_argument('--segmentors', nargs='*', metavar='NAME',
                        help='UperNet entries by name (default: all: '
                        f'{", ".join(e.name for e in SEGMENTORS)})')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--epochs', type=int, default=3,
                        help='Mask R-CNN epochs (the demo trains 8)')
    parser.add_argument('--seg-iters', type=int, default=300,
                        help='UperNet iterations (the demo trains 1100)')
    parser.add_argument('--jobs', type=int, default=2,
                        help='training runs at a time')
    parser.add_argument('--threads', type=int, default=1,
                        help='threads per training run and per measurement')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='more --cfg-options for every training run, e.g. '
                        'train_dataloader.dataset.indices=16 for a quick check')
    parser.add_argument('--inference-size', type=parse_size, default=INFERENCE_SIZE,
                        help='backbone inference size HxW of the latency and '
                        'FLOPs columns')
    parser.add_argument('--flops-size', type=parse_size, default=FLOPS_SIZE,
                        help='size HxW of the second FLOPs column (the size '
                        'the comparison trains at)')
    parser.add_argument('--train-size', type=parse_size, default=TRAIN_SIZE,
                        help='size HxW of the training-iteration column')
    parser.add_argument('--peak-size', type=parse_size, default=PEAK_SIZE,
                        help='size HxW of the training-memory column')
    parser.add_argument('--work-dir', type=Path,
                        default=Path('work_dirs/compare_backbones'))
    parser.add_argument('--out-dir', type=Path, default=Path('docs/comparison'))
    args = parser.parse_args()
    args.detectors = _select(DETECTORS, args.detectors, '--detectors')
    args.segmentors = _select(SEGMENTORS, args.segmentors, '--segmentors')
    detection_schedule(args.epochs)  # fail early on an out-of-range schedule
    segmentation_schedule(args.seg_iters)
    return args


def run_name(entry: Entry, seed: int) -> str:
    """The work-dir name of one (config, recipe, seed) run."""
    recipe = '' if entry.recipe == 'shared' else f'_{entry.recipe}'
    return f'{Path(entry.config).stem}{recipe}_seed{seed}'


def run_key(task: str, config: str, recipe: str, seed: int) -> str:
    """What identifies a run among the records."""
    return f'{task}:{config}:{recipe}:{seed}'


def _job(args, task: str, entry: Entry, seed: int, schedule: List[str],
         marker: str) -> Dict:
    work_dir = args.work_dir / ('detection' if task == 'probe' else task) / run_name(
        entry, seed)
    command = [sys.executable, 'tools/train.py', entry.config, '--work-dir',
               str(work_dir), '--resume', '--cfg-options', f'randomness.seed={seed}',
               *schedule, *args.cfg_options]
    return dict(task=task, entry=entry, seed=seed, work_dir=work_dir,
                command=command, marker=work_dir / marker,
                key=run_key(task, entry.config, entry.recipe, seed))


def training_jobs(args) -> List[Dict]:
    """Every (entry, seed) run, seed-major, with its command line."""
    jobs = []
    for seed in args.seeds:
        for entry in args.detectors:
            schedule = [*detection_schedule(args.epochs),
                        *recipe_options(entry.recipe, args.epochs)]
            jobs.append(_job(args, 'detection', entry, seed, schedule, 'result.json'))
        for entry in args.segmentors:
            jobs.append(_job(args, 'segmentation', entry, seed,
                             segmentation_schedule(args.seg_iters), 'result.json'))
    return jobs


def probe_jobs(args) -> List[Dict]:
    """The probe's runs (first seed): for each backbone of the probe and each
    recipe, the first epoch, then the full run resuming from it (started
    only once the first epoch has finished); all first epochs first."""
    seed = args.seeds[0]
    first_epochs, full_runs = [], []
    for base in PROBE_DETECTORS:
        for recipe in RECIPES:
            entry = replace(base, recipe=recipe)
            schedule = [*detection_schedule(args.epochs),
                        *recipe_options(recipe, args.epochs)]
            first = _job(args, 'probe', entry, seed, [*schedule, *probe_options()],
                         'probe.json')
            full = _job(args, 'detection', entry, seed, schedule, 'result.json')
            first_epochs.append(first)
            full_runs.append(dict(full, after=first['key']))
    return first_epochs + full_runs


def metric_keys(task: str) -> List[str]:
    """The validation metrics a run of ``task`` reports."""
    return [MIOU_METRIC] if task == 'segmentation' else [BBOX_METRIC, SEGM_METRIC]


def finish(job: Dict, returncode: int, seconds: float) -> Dict:
    """Reads a finished run's metrics (a probe's: those of its first epoch,
    and its training loss there) and writes its marker file."""
    keys = metric_keys(job['task'])
    if job['task'] == 'probe':
        metrics = first_epoch_metrics(job['work_dir'], keys)
    else:
        metrics = final_metrics(job['work_dir'], keys)
    entry = job['entry']
    result = dict(task=job['task'], name=entry.name, config=entry.config,
                  recipe=entry.recipe, seed=job['seed'],
                  wall_seconds=round(seconds, 1), returncode=returncode,
                  date=time.strftime('%Y-%m-%d'))
    if returncode != 0 or metrics is None:
        result['error'] = (f'tools/train.py exited with {returncode}; see '
                           f"{job['work_dir'] / 'train.log'}")
        return result
    result['metrics'] = metrics
    if job.get('after'):
        result['note'] = ('wall_seconds counts the epochs after the first; the '
                          'first is the probe run of the same work dir')
    if job['task'] == 'probe':
        result['loss'] = epoch_loss(job['work_dir'], DEMO_EPOCH_ITERS)
    job['marker'].write_text(json.dumps(result, indent=2))
    return result


def thread_env(threads: int) -> Dict[str, str]:
    """This process's environment with ``threads`` threads for torch."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads),
                MKL_NUM_THREADS=str(threads))


def run_all(args, jobs: List[Dict], recorded: Dict[str, Dict],
            records_path: Path) -> List[Dict]:
    """Runs every job that is not recorded, ``args.jobs`` at a time, and
    records each as it finishes."""
    env = thread_env(args.threads)
    pending = [job for job in jobs if job['key'] not in recorded]
    running, failed = [], []
    total = len(pending)
    while pending or running:
        # A job waits for the run it resumes from ('after'); one whose
        # prerequisite failed is dropped with it.
        failed_keys = {result['key'] for result in failed}
        for job in [job for job in pending if job.get('after') in failed_keys]:
            pending.remove(job)
            failed.append(dict(key=job['key'], name=job['entry'].name,
                               seed=job['seed'], error='its first epoch failed'))
        ready = [job for job in pending
                 if job.get('after') is None or job['after'] in recorded]
        if pending and not ready and not running:
            raise RuntimeError('runs wait for runs that are not scheduled: '
                               f"{[job['after'] for job in pending]}")
        while ready and len(running) < args.jobs:
            job = ready.pop(0)
            pending.remove(job)
            job['work_dir'].mkdir(parents=True, exist_ok=True)
            log = open(job['work_dir'] / 'train.log', 'a')
            job['process'] = subprocess.Popen(job['command'], cwd=REPO, env=env,
                                              stdout=log, stderr=subprocess.STDOUT)
            job['log'], job['start'] = log, time.time()
            running.append(job)
            print(f"[{total - len(pending)}/{total}] training {job['entry'].name} "
                  f"({job['task']}, recipe {job['entry'].recipe}, seed "
                  f"{job['seed']}) in {job['work_dir']}", flush=True)
        time.sleep(5)
        for job in [job for job in running if job['process'].poll() is not None]:
            running.remove(job)
            job['log'].close()
            result = finish(job, job['process'].returncode, time.time() - job['start'])
            if 'error' in result:
                failed.append(dict(result, key=job['key']))
                print(f"failed: {job['entry'].name} seed {job['seed']}: "
                      f"{result['error']}", flush=True)
            else:
                recorded[job['key']] = result
                save_records(records_path, recorded)
                print(f"done: {job['entry'].name} seed {job['seed']}: "
                      f"{result['metrics']} ({result['wall_seconds']:.0f} s)",
                      flush=True)
    return failed


def load_records(path: Path) -> Dict[str, Dict]:
    """The recorded runs (``runs.json`` beside the report), by :func:`run_key`."""
    if not path.exists():
        return {}
    return {run_key(r['task'], r['config'], r.get('recipe', 'shared'), r['seed']): r
            for r in json.loads(path.read_text())}


def record_finished(jobs: List[Dict], recorded: Dict[str, Dict]) -> None:
    """Adds the jobs finished in their work dirs to ``recorded`` (the work
    dir's result replaces an older record)."""
    for job in jobs:
        if job['marker'].exists():
            recorded[job['key']] = json.loads(job['marker'].read_text())


def collect_runs(jobs: List[Dict], recorded: Dict[str, Dict]) -> List[Dict]:
    """The recorded results of ``jobs``."""
    return [recorded[job['key']] for job in jobs if job['key'] in recorded]


def ensure_data(args, probe: bool = False) -> None:
    """Generates the demo datasets the selected entries (or the probe) train
    on."""
    for task, entries in (('detection', PROBE_DETECTORS if probe else args.detectors),
                          ('segmentation', [] if probe else args.segmentors)):
        kind, root = DATASETS[task]
        if entries and not (REPO / root).exists():
            subprocess.run([sys.executable, 'tools/generate_demo_data.py', kind],
                           cwd=REPO, check=True)


def size_text(size) -> str:
    """``(800, 1333)`` -> ``'800x1333'``."""
    return f'{size[0]}x{size[1]}'


def machine() -> Dict:
    """Where the figures come from."""
    import torch
    return dict(processor=platform.processor() or platform.machine(),
                cpu_count=os.cpu_count(), torch=torch.__version__,
                python=platform.python_version(), date=time.strftime('%Y-%m-%d'))


def save_records(path: Path, recorded: Dict[str, Dict]) -> None:
    """Adds ``recorded`` to the records in ``path`` (another call of the tool
    may have added some since this one read them) and writes them, sorted."""
    merged = {**load_records(path), **recorded}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([merged[key] for key in sorted(merged)],
                               indent=2) + '\n')


def main():
    args = parse_args()
    records_path = args.out_dir / RECORDS
    recorded = load_records(records_path)
    jobs = dict(probe=probe_jobs(args), train=training_jobs(args))
    record_finished(jobs['probe'] + jobs['train'], recorded)
    save_records(records_path, recorded)
    failed = []
    for phase in ('probe', 'train'):
        if phase in args.phases:
            ensure_data(args, probe=phase == 'probe')
            failed += run_all(args, jobs[phase], recorded, records_path)
    if 'costs' in args.phases:
        measure_costs(args.detectors, dict(inference=args.inference_size,
                                           flops=args.flops_size, train=args.train_size,
                                           peak=args.peak_size),
                      args.threads, args.work_dir)
    if 'report' in args.phases:
        costs_path = args.work_dir / 'costs.json'
        costs = json.loads(costs_path.read_text()) if costs_path.exists() else None
        settings = dict(epochs=args.epochs, seg_iters=args.seg_iters,
                        seeds=args.seeds, threads=args.threads, jobs=args.jobs,
                        cfg_options=args.cfg_options,
                        sizes=dict(inference=size_text(args.inference_size),
                                   flops=size_text(args.flops_size),
                                   train=size_text(args.train_size),
                                   peak=size_text(args.peak_size)),
                        machine=machine())
        paths = write_report(collect_runs(jobs['train'], recorded),
                             collect_runs(jobs['probe'], recorded), costs,
                             args.detectors, args.segmentors, settings,
                             args.out_dir)
        print('written: ' + ', '.join(str(path) for path in paths))
    if failed:
        raise SystemExit(f'{len(failed)} training runs failed: '
                         + '; '.join(f"{r['name']} seed {r['seed']}" for r in failed))


if __name__ == '__main__':
    main()
