"""GPU check: the CUDA tests, then time and memory of the backbones on a GPU.

Runs ``pytest tests/test_cuda.py``, then one training step and one
inference forward (batch 2 with valid regions, under CUDA's sync debug mode
once) of SOFT++-tiny/-small (each solver that runs on the device),
UFO-ViT-small (on CUDA also SyncBatchNorm-converted), mmdet's Swin-T and
PVTv2-b2, in float32 and float16
autocast, at 800x1333 and 1536x1536, each case in its own process with a
hard time limit, within a time budget; writes one JSON file and prints a
table (see :mod:`mmsoft_analysis.gpu_check`). Installs nothing: it runs in
the Python it is started with (the active environment). Exits 1 when
a test or a measurement failed (the file is written either way), 2 on
invalid arguments or when there is no CUDA device.

Example::

    python tools/analysis/gpu_check.py
    python tools/analysis/gpu_check.py --out work_dirs/gpu_check/h200.json \
        --budget-s 300
    # CPU smoke run of the benchmark part:
    python tools/analysis/gpu_check.py --device cpu --sizes 64x64 --repeats 1 \
        --skip-tests
"""
import argparse
import sys

from mmsoft.apis import parse_size
from mmsoft.models.soft_kernels import SOLVERS
from mmsoft_analysis.gpu_check import (AUTOCAST_DTYPES, BACKBONES, DEFAULT_BUDGET_S,
                                       DEFAULT_CASE_TIMEOUT_S, DEFAULT_OUT,
                                       DEFAULT_SOLVERS,
                                       DEFAULT_TESTS_TIMEOUT_S, DTYPES, MODES, SIZES,
                                       CheckSettings,
                                       check_passed, describe_tests, format_table,
                                       require_device, run_check)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default=DEFAULT_OUT, help='results file (JSON)')
    parser.add_argument('--device', default='cuda',
                        help="'cuda', 'cuda:N', or 'cpu' for a smoke run")
    parser.add_argument('--budget-s', type=float, default=DEFAULT_BUDGET_S,
                        help='seconds of benchmark after which the remaining '
                        'measurements are skipped')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=list(SIZES), help='input sizes HxW')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed calls per measurement (median reported)')
    parser.add_argument('--warmup', type=int, default=1,
                        help='untimed calls per measurement')
    parser.add_argument('--backbones', nargs='+', default=list(BACKBONES),
                        choices=BACKBONES)
    parser.add_argument('--solvers', nargs='+', default=list(DEFAULT_SOLVERS),
                        choices=SOLVERS, help='solvers of the SOFT++ backbones')
    parser.add_argument('--dtypes', nargs='+', default=list(DTYPES),
                        choices=sorted(AUTOCAST_DTYPES),
                        help='float32, or an autocast dtype')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--skip-tests', action='store_true',
                        help='do not run tests/test_cuda.py first')
    parser.add_argument('--tests-timeout-s', type=float,
                        default=DEFAULT_TESTS_TIMEOUT_S)
    parser.add_argument('--case-timeout-s', type=float,
                        default=DEFAULT_CASE_TIMEOUT_S,
                        help='hard limit of each measurement, run in its own '
                        'process')
    return parser.parse_args()


def main():
    args = parse_args()
    try:
        require_device(args.device)
        settings = CheckSettings(
            out=args.out, device=args.device, backbones=args.backbones,
            solvers=args.solvers, dtypes=args.dtypes, sizes=args.sizes,
            modes=args.modes, budget_s=args.budget_s, warmup=args.warmup,
            repeats=args.repeats, run_tests=not args.skip_tests,
            tests_timeout_s=args.tests_timeout_s,
            case_timeout_s=args.case_timeout_s)
    except (RuntimeError, ValueError) as error:
        print(f'gpu_check: {error}', file=sys.stderr)
        sys.exit(2)
    data = run_check(settings, log=lambda line: print(line, flush=True))
    summary = data['summary']
    print()
    print(f"{data['meta']['device_name']}, torch {data['meta']['torch']}, "
          f"CUDA {data['meta']['cuda']}")
    print(describe_tests(data['tests']))
    print(format_table(data['records']))
    print(f"{summary['ok']} measured, {summary['error']} failed, "
          f"{summary['skipped']} skipped (budget {args.budget_s:g} s); "
          f'written: {args.out}')
    sys.exit(0 if check_passed(data) else 1)


if __name__ == '__main__':
    main()
