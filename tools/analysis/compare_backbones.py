"""Accuracy against cost: mmsoft's backbones and the libraries' trained side by side.

One command trains every backbone of :mod:`mmsoft_analysis.comparison` on
the demo data with the same Mask R-CNN (and, for four of them, the same
UperNet), with each seed, measures their costs with the project's benchmark
tools, and writes the table and the plots:

1. **train**: ``tools/train.py`` per (config, seed), ``--jobs`` at a time,
   each with ``--threads`` threads, on the demo schedule compressed to
   ``--epochs`` epochs (``--seg-iters`` iterations for UperNet); the final
   validation gives COCO bbox / segm mAP (mmdet's ``CocoMetric``) or mIoU.
   A finished run is kept (``result.json`` in its work dir) and skipped next
   time; a killed one resumes from its last checkpoint.
2. **costs**: ``tools/analysis/benchmark.py`` on each detector's backbone,
   built from its config: parameters, FLOPs (mmsoft's handle-aware counter)
   and inference latency at 800x1333, one training iteration (forward and
   backward) at 800x1333, and the peak of live training memory at 1536x1536.
3. **report**: ``table.md`` (the table, with each seed's value),
   ``comparison.json``, and the plots ``map_vs_latency.png`` and
   ``map_vs_train_memory.png`` in ``--out-dir`` (``docs/comparison/``;
   ``docs/comparison.md`` explains them).

Example::

    python tools/analysis/compare_backbones.py            # everything, ~2 h on 2 cores
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
from pathlib import Path
from typing import Dict, List, Sequence

from mmsoft.apis import parse_size
from mmsoft_analysis import REPO
from mmsoft_analysis.comparison import (BBOX_METRIC, DETECTORS, MIOU_METRIC,
                                        SEGM_METRIC, SEGMENTORS, Entry,
                                        detection_schedule, final_metrics,
                                        segmentation_schedule)
from mmsoft_analysis.comparison_report import write_report

PHASES = ('train', 'costs', 'report')
INFERENCE_SIZE, TRAIN_SIZE, PEAK_SIZE = (800, 1333), (800, 1333), (1536, 1536)
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
    """The work-dir name of one (config, seed) run."""
    return f'{Path(entry.config).stem}_seed{seed}'


def training_jobs(args) -> List[Dict]:
    """Every (entry, seed) run, seed-major, with its command line."""
    jobs = []
    for seed in args.seeds:
        for task, entries in (('detection', args.detectors),
                              ('segmentation', args.segmentors)):
            for entry in entries:
                schedule = (detection_schedule(args.epochs) if task == 'detection'
                            else segmentation_schedule(args.seg_iters))
                work_dir = args.work_dir / task / run_name(entry, seed)
                command = [sys.executable, 'tools/train.py', entry.config,
                           '--work-dir', str(work_dir), '--resume',
                           '--cfg-options', f'randomness.seed={seed}', *schedule,
                           *args.cfg_options]
                jobs.append(dict(task=task, entry=entry, seed=seed,
                                 work_dir=work_dir, command=command))
    return jobs


def metric_keys(task: str) -> List[str]:
    """The validation metrics a run of ``task`` reports."""
    return [BBOX_METRIC, SEGM_METRIC] if task == 'detection' else [MIOU_METRIC]


def finish(job: Dict, returncode: int, seconds: float) -> Dict:
    """Reads a finished run's metrics and writes its ``result.json``."""
    metrics = final_metrics(job['work_dir'], metric_keys(job['task']))
    result = dict(task=job['task'], name=job['entry'].name,
                  config=job['entry'].config, seed=job['seed'],
                  wall_seconds=round(seconds, 1), returncode=returncode)
    if returncode != 0 or metrics is None:
        result['error'] = (f'tools/train.py exited with {returncode}; see '
                           f"{job['work_dir'] / 'train.log'}")
        return result
    result['metrics'] = metrics
    (job['work_dir'] / 'result.json').write_text(json.dumps(result, indent=2))
    return result


def thread_env(threads: int) -> Dict[str, str]:
    """This process's environment with ``threads`` threads for torch."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads),
                MKL_NUM_THREADS=str(threads))


def train_all(args) -> List[Dict]:
    """Runs every unfinished job, ``args.jobs`` at a time."""
    env = thread_env(args.threads)
    pending = [job for job in training_jobs(args)
               if not (job['work_dir'] / 'result.json').exists()]
    running, failed = [], []
    total = len(pending)
    while pending or running:
        while pending and len(running) < args.jobs:
            job = pending.pop(0)
            job['work_dir'].mkdir(parents=True, exist_ok=True)
            log = open(job['work_dir'] / 'train.log', 'a')
            job['process'] = subprocess.Popen(job['command'], cwd=REPO, env=env,
                                              stdout=log, stderr=subprocess.STDOUT)
            job['log'], job['start'] = log, time.time()
            running.append(job)
            print(f"[{total - len(pending)}/{total}] training {job['entry'].name} "
                  f"({job['task']}, seed {job['seed']}) in {job['work_dir']}",
                  flush=True)
        time.sleep(5)
        for job in [job for job in running if job['process'].poll() is not None]:
            running.remove(job)
            job['log'].close()
            result = finish(job, job['process'].returncode, time.time() - job['start'])
            if 'error' in result:
                failed.append(result)
                print(f"failed: {job['entry'].name} seed {job['seed']}: "
                      f"{result['error']}", flush=True)
            else:
                print(f"done: {job['entry'].name} seed {job['seed']}: "
                      f"{result['metrics']} ({result['wall_seconds']:.0f} s)",
                      flush=True)
    return failed


def collect_runs(args) -> List[Dict]:
    """The ``result.json`` of every finished run of the selected entries."""
    runs = []
    for job in training_jobs(args):
        path = job['work_dir'] / 'result.json'
        if path.exists():
            runs.append(json.loads(path.read_text()))
    return runs


def ensure_data(args) -> None:
    """Generates the demo datasets the selected entries train on."""
    for task, entries in (('detection', args.detectors),
                          ('segmentation', args.segmentors)):
        kind, root = DATASETS[task]
        if entries and not (REPO / root).exists():
            subprocess.run([sys.executable, 'tools/generate_demo_data.py', kind],
                           cwd=REPO, check=True)


def benchmark(args, name: str, *options: str) -> Dict:
    """Runs ``tools/analysis/benchmark.py`` on the detectors' backbones (built
    from their configs) and returns its ``results.json``."""
    out_dir = args.work_dir / 'costs' / name
    command = [sys.executable, 'tools/analysis/benchmark.py', '--device', 'cpu',
               '--models', *[entry.config for entry in args.detectors],
               '--out-dir', str(out_dir), *options]
    print('$ ' + ' '.join(command), flush=True)
    subprocess.run(command, cwd=REPO, env=thread_env(args.threads), check=True)
    return json.loads((REPO / out_dir / 'results.json').read_text())


def size_text(size) -> str:
    """``(800, 1333)`` -> ``'800x1333'``."""
    return f'{size[0]}x{size[1]}'


def measure_costs(args) -> Dict:
    """The cost columns, from two benchmark runs; written to ``costs.json``."""
    inference = benchmark(args, 'inference', '--sizes', size_text(args.inference_size),
                          '--flops',
                          '--warmup', '1', '--repeats', '3', '--no-live-memory')
    training = benchmark(args, 'train', '--mode', 'train', '--sizes',
                         size_text(args.train_size), '--warmup', '1', '--repeats',
                         '2', '--peak-sizes', size_text(args.peak_size))
    costs = dict(inference=inference, train=training)
    path = args.work_dir / 'costs.json'
    path.write_text(json.dumps(costs, indent=2))
    return costs


def machine() -> Dict:
    """Where the figures come from."""
    import torch
    return dict(processor=platform.processor() or platform.machine(),
                cpu_count=os.cpu_count(), torch=torch.__version__,
                python=platform.python_version(), date=time.strftime('%Y-%m-%d'))


def main():
    args = parse_args()
    failed = []
    if 'train' in args.phases:
        ensure_data(args)
        failed = train_all(args)
    if 'costs' in args.phases:
        measure_costs(args)
    if 'report' in args.phases:
        costs_path = args.work_dir / 'costs.json'
        costs = json.loads(costs_path.read_text()) if costs_path.exists() else None
        settings = dict(epochs=args.epochs, seg_iters=args.seg_iters,
                        seeds=args.seeds, threads=args.threads, jobs=args.jobs,
                        cfg_options=args.cfg_options,
                        sizes=dict(inference=size_text(args.inference_size),
                                   train=size_text(args.train_size),
                                   peak=size_text(args.peak_size)),
                        machine=machine())
        paths = write_report(collect_runs(args), costs, args.detectors,
                             args.segmentors, settings, args.out_dir)
        print('written: ' + ', '.join(str(path) for path in paths))
    if failed:
        raise SystemExit(f'{len(failed)} training runs failed: '
                         + '; '.join(f"{r['name']} seed {r['seed']}" for r in failed))


if __name__ == '__main__':
    main()
