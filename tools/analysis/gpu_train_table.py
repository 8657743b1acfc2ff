"""The table of a training run on a GPU node (tools/gpu_train_offline.sh):
seconds per iteration, images per second and peak GPU memory of each
training run, read from its work directory, and the demo's COCO mAP.

mmengine's runner writes, for each run, ``WORK_DIR/<timestamp>/vis_data/
scalars.json``: one JSON object per logged training iteration, whose
``time`` is the mean time of the iterations since the previous one (the
logger's interval), ``iter`` the iteration, and, where CUDA is available,
``memory`` the peak of ``torch.cuda.max_memory_allocated`` since the previous
one, in MiB. The first ``--skip`` logged entries (warm-up: cuDNN's and the
allocator's first calls) are left out; the others are averaged, each weighted
by the iterations it covers::

    python tools/analysis/gpu_train_table.py --out work_dirs/gpu_train \\
        --run label=demo work_dir=work_dirs/demo batch=8 size=160x160 \\
              metrics=work_dirs/demo status=0 \\
        --run label=swin-t work_dir=work_dirs/swin batch=2 size=800x800 status=0

Writes ``OUT/gpu_train.md`` and ``OUT/gpu_train.json``. A run whose log has
no entry past the skipped ones has no timing (its row says so); a failed run
keeps its status. Exit status 0, or 2 on invalid arguments.
"""
import argparse
import glob
import json
import os.path as osp
import sys
from typing import Dict, List, Optional

from check_metric import newest_metrics

#: The run every other run's time is compared with, where it was measured.
BASELINE = 'swin-t'
#: The keys of a ``--run``; ``metrics`` and ``status`` are optional.
RUN_KEYS = ('label', 'work_dir', 'batch', 'size', 'metrics', 'status', 'config')
REQUIRED_KEYS = ('label', 'work_dir', 'batch', 'size')
METRICS = ('coco/bbox_mAP', 'coco/segm_mAP')


def parse_run(items: List[str]) -> Dict[str, str]:
    """The ``key=value`` items of one ``--run``.

    Raises:
        ValueError: An item without ``=``, an unknown or repeated key, a
            required key missing, or a batch that is not a positive integer.
    """
    run: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or key not in RUN_KEYS:
            raise ValueError(f'--run item {item!r}: expected KEY=VALUE with KEY one of '
                             f'{", ".join(RUN_KEYS)}')
        if key in run:
            raise ValueError(f'--run item {item!r}: {key} given twice')
        run[key] = value
    missing = [key for key in REQUIRED_KEYS if key not in run]
    if missing:
        raise ValueError(f'--run {" ".join(items)}: missing {", ".join(missing)}')
    if not run['batch'].isdigit() or int(run['batch']) < 1:
        raise ValueError(f'--run batch={run["batch"]!r}: expected a positive integer')
    return run


def training_entries(work_dir: str) -> List[dict]:
    """The logged training iterations of the newest run in ``work_dir``
    (entries with ``iter``, ``time`` and a ``loss``), in order; [] when there
    are none."""
    paths = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    for path in reversed(paths):  # timestamps sort as text: newest first
        entries = []
        with open(path) as file:
            for line in file:
                line = line.strip()
                if not line:
                    continue
                entry = json.loads(line)
                if 'iter' in entry and 'time' in entry and 'loss' in entry:
                    entries.append(entry)
        if entries:
            return entries
    return []


def timing(entries: List[dict], batch: int, skip: int) -> dict:
    """Seconds per iteration, images per second and peak memory of the
    entries after the first ``skip``, weighted by the iterations each
    covers; the values are None where no entry is left."""
    result = dict(iterations_logged=entries[-1]['iter'] if entries else 0,
                  iterations_timed=0, seconds_per_iter=None, images_per_s=None,
                  peak_memory_mib=None)
    if len(entries) <= skip:
        return result
    previous = entries[skip - 1]['iter'] if skip else 0
    seconds = iterations = 0
    for entry in entries[skip:]:
        covered = entry['iter'] - previous
        previous = entry['iter']
        seconds += entry['time'] * covered
        iterations += covered
    memory = [entry['memory'] for entry in entries if 'memory' in entry]
    per_iter = seconds / iterations
    result.update(iterations_timed=iterations, seconds_per_iter=per_iter,
                  images_per_s=batch / per_iter,
                  peak_memory_mib=max(memory) if memory else None)
    return result


def demo_metrics(work_dir: str) -> Dict[str, Optional[float]]:
    """The COCO bbox and segm mAP of the newest evaluation in ``work_dir``
    (None where there is none)."""
    try:
        _, metrics = newest_metrics(work_dir)
    except FileNotFoundError:
        metrics = {}
    return {name: metrics.get(name) for name in METRICS}


def describe_status(status: Optional[str]) -> str:
    if status is None or status == '0':
        return 'ok'
    if status == '124':
        return 'stopped by the budget'
    if status == 'skipped':
        return 'skipped (no budget left)'
    return f'failed (exit status {status})'


def build_rows(runs: List[Dict[str, str]], skip: int) -> List[dict]:
    rows = []
    for run in runs:
        row = dict(label=run['label'], config=run.get('config'),
                   batch=int(run['batch']), size=run['size'],
                   status=describe_status(run.get('status')))
        row.update(timing(training_entries(run['work_dir']), int(run['batch']), skip))
        if 'metrics' in run:
            row.update(demo_metrics(run['metrics']))
        rows.append(row)
    baseline = next((row for row in rows if row['label'] == BASELINE
                     and row['seconds_per_iter']), None)
    for row in rows:
        row['time_vs_' + BASELINE] = (
            row['seconds_per_iter'] / baseline['seconds_per_iter']
            if baseline and row['seconds_per_iter'] and row['size'] == baseline['size']
            and row['batch'] == baseline['batch'] else None)
    return rows


def cell(value, digits: int) -> str:
    return '–' if value is None else f'{value:.{digits}f}'


def format_markdown(rows: List[dict], device: str, notes: List[str]) -> str:
    lines = ['# Training on the GPU node', '', device, '',
             '| run | batch | image size | iterations timed | s / iteration '
             f'| images / s | time vs {BASELINE} | peak GPU memory (MiB) '
             '| bbox mAP | segm mAP | status |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for row in rows:
        memory = row['peak_memory_mib']
        lines.append(
            f"| {row['label']} | {row['batch']} | {row['size']} "
            f"| {row['iterations_timed']} of {row['iterations_logged']} "
            f"| {cell(row['seconds_per_iter'], 3)} | {cell(row['images_per_s'], 2)} "
            f"| {cell(row['time_vs_' + BASELINE], 2)} "
            f"| {'–' if memory is None else f'{memory:.0f}'} "
            f"| {cell(row.get('coco/bbox_mAP'), 3)} "
            f"| {cell(row.get('coco/segm_mAP'), 3)} "
            f"| {row['status']} |")
    return '\n'.join(lines + [''] + notes) + '\n'


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description='Tabulate the training runs of tools/gpu_train_offline.sh.')
    parser.add_argument('--out', required=True,
                        help='folder of gpu_train.md and gpu_train.json')
    parser.add_argument('--run', nargs='+', action='append', required=True,
                        metavar='KEY=VALUE',
                        help='one run: label=, work_dir=, batch=, size= and '
                        'optionally metrics= (a tools/test.py work dir), status= '
                        '(its exit status), config=')
    parser.add_argument('--skip', type=int, default=1,
                        help='logged entries left out at the start (default 1)')
    parser.add_argument('--device', default='', help='a line naming the device')
    parser.add_argument('--note', action='append', default=[],
                        help='a line under the table (repeatable)')
    args = parser.parse_args(argv)
    if args.skip < 0:
        parser.error(f'--skip {args.skip}: expected 0 or more')
    try:
        runs = [parse_run(items) for items in args.run]
    except ValueError as error:
        parser.error(str(error))
    rows = build_rows(runs, args.skip)
    with open(osp.join(args.out, 'gpu_train.json'), 'w') as file:
        json.dump(dict(device=args.device, skip=args.skip, runs=rows,
                       notes=args.note), file, indent=2)
        file.write('\n')
    text = format_markdown(rows, args.device, args.note)
    with open(osp.join(args.out, 'gpu_train.md'), 'w') as file:
        file.write(text)
    print(text, end='')
    return 0


if __name__ == '__main__':
    sys.exit(main())
