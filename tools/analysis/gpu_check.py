"""GPU check: the CUDA tests, then time and memory of the backbones on a GPU.

Needs torch, timm for the peers and pytest for the tests; no OpenMMLab
package. Runs ``pytest tests/test_cuda.py``, then measures, each case in its
own process with a hard time limit, within a time budget, the phases of
:mod:`mmsoft_analysis.gpu_check` in order: training step and inference
(batch 2, valid regions for mmsoft's backbones) of SOFT++-tiny/-small,
UFO-ViT-small and timm's Swin-T, PVTv2-b2 and XCiT-S12 at 800x1333 in
float32 and bfloat16 autocast, then at 1536x1536, SOFT++'s other solvers,
torch.compile beside eager, float16 autocast, and the largest training batch
at 1024x1024 within a 16 GiB cap. Writes the results (JSON) and a Markdown
table after every measurement and prints the table at the end. Installs
nothing: it runs in the Python it is started with. Exits 1 when a test or a
measurement failed (the files are written either way), 2 on invalid
arguments or when there is no CUDA device.

Example::

    python tools/analysis/gpu_check.py
    python tools/analysis/gpu_check.py --out work_dirs/gpu_check/h200.json \
        --budget-s 300
    # CPU smoke run of the benchmark part, every phase at 64x64:
    python tools/analysis/gpu_check.py --device cpu --sizes 64x64 --repeats 1 \
        --skip-tests
"""
import argparse
import sys

from mmsoft_analysis.gpu_backbones import BACKBONES, DEFAULT_BACKBONES
from mmsoft_analysis.gpu_check import (AUTOCAST_DTYPES, CAPACITY_CAP_GIB,
                                       CPU_THREADS, DEFAULT_BUDGET_S,
                                       DEFAULT_CASE_TIMEOUT_S,
                                       DEFAULT_COMPILE_TIMEOUT_S, DEFAULT_OUT,
                                       DEFAULT_SOLVERS, DEFAULT_TESTS_TIMEOUT_S,
                                       DTYPES, MODES, PHASES, SIZES, SOLVERS,
                                       CheckSettings, check_passed,
                                       describe_tests, format_markdown,
                                       parse_size, require_device, run_check)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default=DEFAULT_OUT, help='results file (JSON)')
    parser.add_argument('--markdown', default=None, metavar='PATH',
                        help='Markdown table (default: --out with .md)')
    parser.add_argument('--device', default='cuda',
                        help="'cuda', 'cuda:N', or 'cpu' for a smoke run")
    parser.add_argument('--budget-s', type=float, default=DEFAULT_BUDGET_S,
                        help='seconds of benchmark after which the remaining '
                        'cases are skipped')
    parser.add_argument('--total-budget-s', type=float, default=None,
                        help='seconds for the whole check, tests included: the '
                        'benchmark gets what the tests leave (at most --budget-s)')
    parser.add_argument('--sizes', nargs='+', type=parse_size, default=list(SIZES),
                        help='input sizes HxW: the first in the core phase, the '
                        'others in the large one')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed calls per measurement (median reported)')
    parser.add_argument('--warmup', type=int, default=1,
                        help='untimed calls per measurement')
    parser.add_argument('--backbones', nargs='+', default=list(DEFAULT_BACKBONES),
                        choices=BACKBONES)
    parser.add_argument('--solvers', nargs='+', default=list(DEFAULT_SOLVERS),
                        choices=SOLVERS,
                        help='SOFT++ solvers: the first in every phase, the '
                        'others (as they run on the device) in the solvers phase')
    parser.add_argument('--dtypes', nargs='+', default=list(DTYPES),
                        choices=sorted(AUTOCAST_DTYPES),
                        help='float32, or an autocast dtype (float16 is measured '
                        'in its own late phase)')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--phases', nargs='+', default=list(PHASES), choices=PHASES)
    parser.add_argument('--skip-tests', action='store_true',
                        help='do not run tests/test_cuda.py first')
    parser.add_argument('--tests-timeout-s', type=float,
                        default=DEFAULT_TESTS_TIMEOUT_S)
    parser.add_argument('--case-timeout-s', type=float,
                        default=DEFAULT_CASE_TIMEOUT_S,
                        help='hard limit of each case, run in its own process')
    parser.add_argument('--compile-timeout-s', type=float,
                        default=DEFAULT_COMPILE_TIMEOUT_S,
                        help='hard limit of a compiled case')
    parser.add_argument('--compile-backend', default=None,
                        help="torch.compile's backend (default: inductor on "
                        'CUDA, eager on the CPU)')
    parser.add_argument('--capacity-size', type=parse_size, default=None,
                        help='input of the capacity search (default: 1024x1024 '
                        'on CUDA, the first size on the CPU)')
    parser.add_argument('--capacity-cap-gib', type=float, default=CAPACITY_CAP_GIB,
                        help='memory cap of the capacity search')
    parser.add_argument('--capacity-max-batch', type=int, default=None,
                        help='largest batch the capacity search tries (default: '
                        '512 on CUDA, 2 on the CPU)')
    parser.add_argument('--cpu-threads', type=int, default=CPU_THREADS,
                        help="torch's threads in each case's process on the CPU")
    return parser.parse_args()


def main():
    args = parse_args()
    try:
        require_device(args.device)
        settings = CheckSettings(
            out=args.out, markdown=args.markdown, device=args.device,
            backbones=args.backbones, solvers=args.solvers, dtypes=args.dtypes,
            sizes=args.sizes, modes=args.modes, phases=args.phases,
            budget_s=args.budget_s, total_budget_s=args.total_budget_s,
            warmup=args.warmup, repeats=args.repeats,
            run_tests=not args.skip_tests, tests_timeout_s=args.tests_timeout_s,
            case_timeout_s=args.case_timeout_s,
            compile_timeout_s=args.compile_timeout_s,
            compile_backend=args.compile_backend, capacity_size=args.capacity_size,
            capacity_cap_gib=args.capacity_cap_gib,
            capacity_max_batch=args.capacity_max_batch,
            cpu_threads=args.cpu_threads)
    except (RuntimeError, ValueError) as error:
        print(f'gpu_check: {error}', file=sys.stderr)
        sys.exit(2)
    data = run_check(settings, log=lambda line: print(line, flush=True))
    summary = data['summary']
    print()
    print(format_markdown(data))
    print(describe_tests(data['tests']))
    print(f"{summary['ok']} measured, {summary['error']} failed, "
          f"{summary['skipped']} skipped (budget "
          f"{data['meta']['benchmark_budget_s']:g} s); "
          f'written: {settings.out}, {settings.markdown}')
    sys.exit(0 if check_passed(data) else 1)


if __name__ == '__main__':
    main()
