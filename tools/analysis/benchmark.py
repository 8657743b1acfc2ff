"""Time and memory of backbones and whole detectors, side by side.

Each model and input runs in a fresh process, the models in turn round after
round (``--rounds``: an interleaved A/B against the first model); docs/benchmarks.md
describes the options and the report. Exit status: 0, 1 when a measurement or a
test failed, 2 on invalid arguments or CUDA asked for where there is none.
"""
import argparse
import dataclasses
import shlex
import sys

from mmsoft_analysis import parse_size
from mmsoft_analysis.models import NAMES
from mmsoft_analysis.report import markdown
from mmsoft_analysis.runner import MODES, PRECISIONS, Settings, passed, run_benchmark

GPU_MODELS = ['soft++-tiny', 'soft++-small', 'ufo-vit-small', 'timm-swin-t',
              'timm-pvtv2-b2']
GPU_CHECK = dict(models=GPU_MODELS, images=[(800, 1199), (800, 1067)],
                 precisions=['float32', 'amp'], optimizer='adamw', kernels=2,
                 host_sync=True, budget_s=360.)
#: What a preset sets where an option is not given: ``smoke``, tiny inputs
#: and few steps on the CPU; ``gpu-check``, the one-command GPU check (``make
#: gpu-check``); ``gpu-benchmark``, the GPU benchmark of docs/cost.md (``make
#: gpu-benchmark``, ``tools/gpu_node.sh run check``).
PRESETS = dict(
    smoke=dict(models=['soft++-tiny', 'timm-swin-t'], images=[(32, 64), (32, 48)],
               warmup=1, steps=2, amp_dtype='bfloat16'),
    **{'gpu-check': GPU_CHECK,
       'gpu-benchmark': dict(GPU_CHECK, compile='inductor', warmup=10, steps=15,
                             rounds=2, budget_s=540.)})


def parse_args(argv):
    """The arguments, a preset's values where an option is not given."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    add = parser.add_argument
    add('--preset', choices=PRESETS,
        help='settings where not given: ' + ', '.join(PRESETS))
    add('--models', nargs='+', metavar='SPEC', default=[
        'soft++-tiny', 'soft++-small', 'ufo-vit-small', 'swin-t', 'pvtv2-b2'],
        help=f'[LABEL=]NAME[:key=value,...], NAME one of {", ".join(NAMES)} or a '
        'config path (default: %(default)s)')
    add('--sizes', nargs='+', type=parse_size, metavar='HxW',
        help='inputs, each --batch images of one size')
    add('--batch', type=int, default=1)
    add('--images', nargs='+', type=parse_size, metavar='HxW', help='one batch of '
        "these images, padded to multiples of 32; mmsoft's backbones get each "
        'valid region')
    add('--device', default='cpu', help="'cpu', 'cuda' or 'cuda:N'")
    add('--detector', action='store_true',
        help="the model's whole Mask R-CNN (mmdet's configs)")
    add('--modes', nargs='+', default=list(MODES), choices=MODES)
    add('--precisions', nargs='+', default=['float32'], choices=PRECISIONS)
    add('--amp-dtype', default='float16', choices=('float16', 'bfloat16'),
        help='autocast dtype of amp')
    add('--optimizer', default='none', choices=('none', 'adamw'),
        help="the training step's optimizer step")
    add('--compile', nargs='?', const='inductor', metavar='BACKEND',
        help='also compiled, after eager (torch.compile with BACKEND, default '
        'inductor)')
    add('--warmup', type=int, default=1, help='untimed steps')
    add('--steps', type=int, default=3, help='timed steps per process')
    add('--rounds', type=int, default=1,
        help='processes per model and input, the models in turn')
    add('--threads', type=int, default=1, help="torch's threads on the CPU")
    add('--memory', action='store_true',
        help="CPU: the resident set's growth over the first step")
    add('--live-memory', action='store_true',
        help='CPU: the peak of live memory, in one more process')
    add('--kernels', type=int, default=0, metavar='STEPS', help='GPU: kernels per step '
        'and GPU-busy time over STEPS profiled steps (first round)')
    add('--flops', action='store_true', help='FLOPs of the forward')
    add('--regions', action='store_true',
        help='time, FLOPs and kernels per region and operator class')
    add('--saved-tensors', action='store_true',
        help='the bytes autograd keeps, by top-level module')
    add('--capacity', type=parse_size, metavar='HxW',
        help='the largest training batch at HxW within --memory-limit-gb')
    add('--memory-limit-gb', type=float, default=16.)
    add('--tests', nargs='*', metavar='PATH',
        help='run pytest first (default tests/test_cuda.py)')
    add('--budget-s', type=float, default=1e9,
        help='seconds for the whole run, tests included')
    add('--case-timeout-s', type=float, default=900.)
    add('--out-dir', default='work_dirs/benchmark')
    preset = dict(PRESETS.get(parser.parse_known_args(argv)[0].preset, {}))
    preset.pop('images', None)  # settings_of's: --sizes replaces them
    parser.set_defaults(**preset)
    return parser.parse_args(argv)


def settings_of(args, argv) -> Settings:
    """The settings of the parsed arguments: without ``--images`` and
    ``--sizes``, the preset's images or one image of 800x1333."""
    images = args.images or (None if args.sizes else
                             PRESETS.get(args.preset, {}).get('images'))
    inputs = ([images] if images else
              [[size] * args.batch for size in args.sizes or [(800, 1333)]])
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)
              if hasattr(args, f.name)}
    fields.update(inputs=inputs, pad=32 if images else 1,
                  tests=() if args.tests is None else
                  args.tests or ['tests/test_cuda.py'],
                  command='python tools/analysis/benchmark.py ' + shlex.join(argv))
    return Settings(**fields)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        settings = settings_of(args, argv)
        data = run_benchmark(settings, log=lambda line: print(line, flush=True))
    except (RuntimeError, ValueError) as error:
        print(f'benchmark: {error}', file=sys.stderr)
        return 2
    print('\n' + markdown(data))
    print(f'written: {settings.out_dir}/results.json, {settings.out_dir}/results.md')
    return 0 if passed(data) else 1


if __name__ == '__main__':
    sys.exit(main())
