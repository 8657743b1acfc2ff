"""Accuracy against cost: mmsoft's backbones and the libraries' trained side by side.

Trains every backbone of :mod:`mmsoft_analysis.comparison` on the demo data with
each seed, measures their costs and writes the table and plots into
``--out-dir`` (docs/comparison.md); a run recorded in ``runs.json`` is not run
again.
"""
import argparse
import json
import sys
from pathlib import Path

from mmsoft_analysis.comparison import (DETECTORS, SEGMENTORS, detection_schedule,
                                        load_records, machine, measure_costs,
                                        probe_jobs, run_jobs, save_records,
                                        segmentation_schedule, training_jobs,
                                        write_report)

PHASES = ('probe', 'train', 'costs', 'report')
#: The sizes of the cost columns (HxW).
SIZES = dict(inference=(800, 1333), flops=(160, 160), train=(800, 1333),
             peak=(1536, 1536))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--phases', nargs='+', choices=PHASES, default=list(PHASES))
    for option, entries, what in (('--detectors', DETECTORS, 'Mask R-CNN'),
                                  ('--segmentors', SEGMENTORS, 'UperNet')):
        names = [entry.name for entry in entries]
        parser.add_argument(option, nargs='*', metavar='NAME', default=names,
                            help=f"{what} entries by name (default: all: "
                            f"{', '.join(names)})")
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--epochs', type=int, default=3,
                        help='Mask R-CNN epochs (the demo trains 8)')
    parser.add_argument('--seg-iters', type=int, default=300,
                        help='UperNet iterations (the demo trains 1100)')
    parser.add_argument('--jobs', type=int, default=2, help='training runs at a time')
    parser.add_argument('--threads', type=int, default=1,
                        help='threads per training run and per measurement')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='more --cfg-options for every training run, e.g. '
                        'train_dataloader.dataset.indices=16 for a quick check')
    parser.add_argument('--work-dir', type=Path,
                        default=Path('work_dirs/compare_backbones'))
    parser.add_argument('--out-dir', type=Path, default=Path('docs/comparison'))
    args = parser.parse_args(argv)
    for option, entries in (('detectors', DETECTORS), ('segmentors', SEGMENTORS)):
        known = {entry.name: entry for entry in entries}
        unknown = [name for name in getattr(args, option) if name not in known]
        if unknown:
            parser.error(f'--{option}: {unknown} not known; expected names from '
                         f'{list(known)}.')
        setattr(args, option, [known[name] for name in getattr(args, option)])
    try:  # an out-of-range schedule fails before anything runs
        detection_schedule(args.epochs)
        segmentation_schedule(args.seg_iters)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    records = args.out_dir / 'runs.json'
    jobs = dict(probe=probe_jobs(args), train=training_jobs(args))
    recorded = load_records(records, jobs['probe'] + jobs['train'])
    save_records(records, recorded)
    failed = []
    for phase in jobs:  # probe, then train
        if phase in args.phases:
            failed += run_jobs(jobs[phase], recorded, records, args.jobs, args.threads)
    if 'costs' in args.phases:
        measure_costs(args.detectors, SIZES, args.threads, args.work_dir)
    if 'report' in args.phases:
        costs = args.work_dir / 'costs.json'
        settings = dict(epochs=args.epochs, seg_iters=args.seg_iters, seeds=args.seeds,
                        threads=args.threads, jobs=args.jobs,
                        cfg_options=args.cfg_options,
                        sizes={kind: f'{h}x{w}' for kind, (h, w) in SIZES.items()},
                        machine=machine())
        runs = {phase: [recorded[job['key']] for job in jobs[phase]
                        if job['key'] in recorded] for phase in jobs}
        paths = write_report(runs['train'], runs['probe'],
                             json.loads(costs.read_text()) if costs.exists() else None,
                             args.detectors, args.segmentors, settings, args.out_dir)
        print('written: ' + ', '.join(str(path) for path in paths))
    if failed:
        print(f'{len(failed)} training runs failed: '
              + '; '.join(f"{r['name']} seed {r['seed']}" for r in failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
