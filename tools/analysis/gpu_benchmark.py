"""GPU benchmark: what mmdet users run, on one card, in one run.

Measures SOFT++-tiny, SOFT++-small, UFO-ViT-small, Swin-T and PVTv2-b2
(mmdet's where mmdet imports, else timm's) and timm's PVTv2-b2-li: the
backbone's training step (forward, backward, AdamW) and inference on batch
2 of two COCO-like sizes with their valid regions, float32 and mixed
precision (float16 autocast with a loss scaler); then the training step's
memory at 1536x1536, a whole Mask R-CNN step, the CUDA tests, each region's
time and FLOP rate, one 800x1333 image, and torch.compile. Each model runs
in a fresh process per round, the models in turn; each setting is timed
by CUDA events (median and spread), its kernels and GPU-busy time counted
by torch.profiler, its memory peaks read from the allocator. The phases run
in the order given, within a time budget; what the budget cuts is listed
as skipped. Writes the results (JSON) and the tables with the targets of
the issue (Markdown) after every measurement.

Exit status: 0 when every measurement (and the tests, where they ran)
passed, 1 when one failed, 2 on invalid arguments or when CUDA is asked
for and there is none. Missed targets do not change it.

Example::

    python tools/analysis/gpu_benchmark.py                    # the whole run, on CUDA
    python tools/analysis/gpu_benchmark.py --phases eager memory --budget-s 300
    python tools/analysis/gpu_benchmark.py --device cpu --smoke   # CPU smoke mode
"""
import argparse
import sys

from mmsoft_analysis.gpu_benchmark import (CPU_SMOKE_COMMAND, DEFAULT_BUDGET_S,
                                           DEFAULT_CASE_TIMEOUT_S,
                                           DEFAULT_COMPILE_TIMEOUT_S, DEFAULT_OUT,
                                           DEFAULT_PHASES, DEFAULT_TESTS_TIMEOUT_S,
                                           DETECTOR_CHOICES, DETECTOR_MODELS,
                                           MEMORY_MODELS, MODELS, PEER_CHOICES,
                                           PHASES, BenchmarkSettings, command_line,
                                           passed, require_benchmark_device,
                                           run_benchmark)
from mmsoft_analysis.gpu_benchmark_report import format_markdown
from mmsoft_analysis.gpu_check import CUDA_TESTS
from mmsoft_analysis.gpu_benchmark_steps import AMP_DTYPES, MODES, PRECISIONS

from mmsoft_analysis.sizes import parse_size


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                     epilog=f'CPU smoke mode: {CPU_SMOKE_COMMAND}')
    parser.add_argument('--out', default=DEFAULT_OUT, help='results file (JSON)')
    parser.add_argument('--markdown', default=None, metavar='PATH',
                        help='the tables (default: --out with .md)')
    parser.add_argument('--device', default='cuda', help="'cuda', 'cuda:N' or 'cpu'")
    parser.add_argument('--smoke', action='store_true',
                        help='tiny inputs and light detector heads (the CPU smoke '
                        'mode; with --device cpu also 1 warm-up and 2 timed steps '
                        'unless given)')
    parser.add_argument('--phases', nargs='+', default=list(DEFAULT_PHASES),
                        choices=list(PHASES), metavar='PHASE',
                        help='phases, run in the order given: '
                        f'{", ".join(PHASES)} (default: all, in that order)')
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=MODELS,
                        metavar='MODEL', help=f'models: {", ".join(MODELS)} '
                        '(default: all)')
    parser.add_argument('--memory-models', nargs='+', default=None, choices=MODELS,
                        metavar='MODEL', help='models of the memory phase (default: '
                        f'{" ".join(MEMORY_MODELS)}, those of --models)')
    parser.add_argument('--detector-models', nargs='+', default=None, choices=MODELS,
                        metavar='MODEL', help='models of the detector phase (default: '
                        f'{" ".join(DETECTOR_MODELS)}, those of --models)')
    parser.add_argument('--precisions', nargs='+', default=list(PRECISIONS),
                        choices=PRECISIONS)
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--coco-shapes', nargs='+', type=parse_size, default=None,
                        metavar='HxW', help='the images of the batch (default '
                        '800x1199 800x1067)')
    parser.add_argument('--single-shape', type=parse_size, default=None, metavar='HxW',
                        help='the single phase\'s image (default 800x1333)')
    parser.add_argument('--memory-shape', type=parse_size, default=None, metavar='HxW',
                        help='the memory phase\'s image (default 1536x1536)')
    parser.add_argument('--rounds', type=int, default=2,
                        help='processes per model and phase, in turn with the others')
    parser.add_argument('--warmup', type=int, default=None,
                        help='untimed steps per setting and round (default 10)')
    parser.add_argument('--steps', type=int, default=None,
                        help='timed steps per setting over all rounds (default 30)')
    parser.add_argument('--profile-steps', type=int, default=2,
                        help='steps under torch.profiler for kernels and GPU busy')
    parser.add_argument('--budget-s', type=float, default=DEFAULT_BUDGET_S,
                        help='seconds for the whole run, tests included')
    parser.add_argument('--case-timeout-s', type=float, default=DEFAULT_CASE_TIMEOUT_S)
    parser.add_argument('--compile-timeout-s', type=float,
                        default=DEFAULT_COMPILE_TIMEOUT_S)
    parser.add_argument('--tests-timeout-s', type=float,
                        default=DEFAULT_TESTS_TIMEOUT_S)
    parser.add_argument('--compile-backend', default=None,
                        help='torch.compile backend (default: inductor on CUDA, '
                        'eager on the CPU)')
    parser.add_argument('--compile-mode', default=None,
                        help="torch.compile mode (e.g. 'reduce-overhead')")
    parser.add_argument('--amp-dtype', default=None, choices=AMP_DTYPES,
                        help='autocast dtype of mixed precision (default float16; '
                        'bfloat16 in the CPU smoke mode)')
    parser.add_argument('--peers', default='auto', choices=PEER_CHOICES,
                        help="Swin-T and PVTv2-b2: mmdet's where it imports (auto), "
                        "or timm's, or mmdet's")
    parser.add_argument('--detector', default='auto', choices=DETECTOR_CHOICES,
                        help="Mask R-CNN: mmdet's where mmdet and mmcv's ops import "
                        "(auto), else torchvision's")
    parser.add_argument('--tests', nargs='+', default=list(CUDA_TESTS),
                        metavar='PATH', help='what the tests phase runs with '
                        'pytest (default tests/test_cuda.py)')
    parser.add_argument('--threads', type=int, default=1,
                        help="torch's threads in each process on the CPU")
    return parser.parse_args(argv)


def _or_those_of(given, default, models):
    """``given``, or those of ``default`` that ``models`` holds."""
    return given if given is not None else [m for m in default if m in models]


def settings_of(args, argv) -> BenchmarkSettings:
    """The settings of the parsed arguments (the smoke mode's defaults where
    an argument was not given)."""
    cpu_smoke = args.smoke and args.device == 'cpu'
    fields = dict(
        out=args.out, markdown=args.markdown, device=args.device, smoke=args.smoke,
        phases=args.phases, models=args.models,
        memory_models=_or_those_of(args.memory_models, MEMORY_MODELS, args.models),
        detector_models=_or_those_of(args.detector_models, DETECTOR_MODELS,
                                     args.models),
        precisions=args.precisions, modes=args.modes, rounds=args.rounds,
        warmup=args.warmup if args.warmup is not None else (1 if cpu_smoke else 10),
        steps=args.steps if args.steps is not None else (2 if cpu_smoke else 30),
        profile_steps=args.profile_steps, budget_s=args.budget_s,
        case_timeout_s=args.case_timeout_s, compile_timeout_s=args.compile_timeout_s,
        tests_timeout_s=args.tests_timeout_s, compile_backend=args.compile_backend,
        compile_mode=args.compile_mode,
        amp_dtype=args.amp_dtype or ('bfloat16' if cpu_smoke else 'float16'),
        peers=args.peers, detector=args.detector, threads=args.threads,
        tests=args.tests,
        command=command_line(argv))
    for name in ('coco_shapes', 'single_shape', 'memory_shape'):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    return BenchmarkSettings(**fields)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        settings = settings_of(args, argv)
        require_benchmark_device(settings.device)
    except (RuntimeError, ValueError) as error:
        print(f'gpu_benchmark: {error}', file=sys.stderr)
        return 2
    data = run_benchmark(settings, log=lambda line: print(line, flush=True))
    print()
    print(format_markdown(data))
    summary = data['summary']
    print(f"{summary['ok']} measured, {summary['error']} failed, "
          f"{summary['skipped']} skipped in {data['meta']['seconds']:.0f} s; written: "
          f'{settings.out}, {settings.markdown}')
    return 0 if passed(data) else 1


if __name__ == '__main__':
    sys.exit(main())
