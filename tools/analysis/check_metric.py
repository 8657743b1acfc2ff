"""Check the newest evaluation of a work directory against a floor.

Exits with status 1, saying so, when ``METRIC`` of the newest
``WORK_DIR/<timestamp>/<timestamp>.json`` is missing or below ``MINIMUM``::

    python tools/analysis/check_metric.py WORK_DIR METRIC MINIMUM
"""
import argparse
import glob
import json
import os.path as osp
import sys
from typing import List, Optional, Tuple


def newest_metrics(work_dir: str) -> Tuple[str, dict]:
    """The newest ``<timestamp>/<timestamp>.json`` of ``work_dir`` and its
    metrics (FileNotFoundError where ``work_dir`` holds no evaluation)."""
    paths = [path for path in glob.glob(osp.join(work_dir, '*', '*.json'))
             if osp.basename(path) == osp.basename(osp.dirname(path)) + '.json']
    if not paths:
        raise FileNotFoundError(
            f'work_dir={work_dir!r} holds no evaluation '
            '(<timestamp>/<timestamp>.json, written by tools/test.py)')
    path = max(paths, key=osp.basename)  # timestamps sort as text
    with open(path) as file:
        return path, json.load(file)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description='Check the newest evaluation of a work directory.')
    parser.add_argument('work_dir', help='the work directory of tools/test.py')
    parser.add_argument('metric', help="a metric's name, e.g. coco/bbox_mAP")
    parser.add_argument('minimum', type=float, help='the lowest value that passes')
    args = parser.parse_args(argv)
    try:
        path, metrics = newest_metrics(args.work_dir)
        if args.metric not in metrics:
            raise LookupError(f'{path} has no metric={args.metric!r}; it has: '
                              f'{", ".join(sorted(metrics))}')
        value = float(metrics[args.metric])
        if value < args.minimum:
            raise ValueError(f'{args.metric} = {value:.3f} is below the expected '
                             f'minimum {args.minimum} ({path})')
    except (FileNotFoundError, LookupError, ValueError) as error:
        print(f'check_metric: {error}', file=sys.stderr)
        return 1
    print(f'{args.metric} = {value:.3f} (at least {args.minimum}: ok; {path})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
