"""Latency and peak memory of backbones at several input sizes, side by side.

Each (backbone, size) is measured in a fresh process (peak memory is then
that call's own); SOFT and UFO-ViT run next to four peers built in the same
environment: mmdet's Swin-T (``swin-t``) and PVTv2-b2 (``pvtv2-b2``), and
timm's PVTv2-b2-li (``pvtv2-b2-li``, keys pooled to 7x7) and XCiT-S12
(``xcit-s12``, blocks 3/5/7/11 resampled to strides 4-32 as in XCiT's
detection code), the last two through mmpretrain's ``TIMMBackbone`` (they
need timm, mmpretrain and torchvision; where those are missing their rows
record the import error). Results: ``results.json``, ``results.csv`` and
``scaling.png`` (time and memory against the pixel count) in ``--out-dir``.

``--mode train`` measures training: forward plus backward of each backbone
at ``--batch`` images; ``--detectors`` adds one Mask R-CNN training
iteration per detector (``detectors.csv``, with the bytes autograd keeps in
the backbone, neck and heads; the peers' Mask R-CNNs are mmdet's Swin-T
config with the backbone and the FPN's input widths swapped);
``--peak-sizes`` adds untimed training peaks at more sizes (``peaks.csv``);
``--compile`` measures every backbone a second time through
``torch.compile`` (time, peaks and ``compile_seconds``, the first call's);
``--capacity-size`` adds the largest training batch within
``--memory-limit-gb`` per backbone, extrapolated linearly from batches 1
and 2 (``capacity.csv``).

On CPU every measurement runs twice: once for time and the peak resident
set (``peak_bytes``), once more in a process whose allocator returns freed
memory at once, for the peak of live memory (``live_peak_bytes``, what a
GPU's ``max_memory_allocated`` reports; see :mod:`mmsoft_analysis.measure`).
The batch capacity uses the live peaks. ``--no-live-memory`` skips it.

Example::

    python tools/analysis/benchmark.py --models soft-tiny soft-small swin-t pvtv2-b2 \
        pvtv2-b2-li xcit-s12 --sizes 512x512 800x1333 1024x1024 --repeats 3
    python tools/analysis/benchmark.py --models soft-small:solver=newton --sizes 800x1333
    python tools/analysis/benchmark.py --mode train --compile --sizes 512x512 \
        --models soft-tiny:solver=newton ufo-vit-tiny swin-t pvtv2-b2-li
    python tools/analysis/benchmark.py --mode train --models soft-tiny swin-t \
        --sizes 800x1333 --detectors soft++-tiny swin-t pvtv2-b2 pvtv2-b2-li \
        xcit-s12 --capacity-size 1024x1024
"""
import argparse
import json
import os
import platform
import subprocess
import time

import torch

from mmsoft_analysis.sizes import parse_size
from mmsoft_analysis import worker_command, worker_env
from mmsoft_analysis.batch_capacity import largest_batch
from mmsoft_analysis.detector_step import DETECTOR_CONFIGS
from mmsoft_analysis.measure import matmul_throughput
from mmsoft_analysis.peers import BACKBONES, parse_spec
from mmsoft_analysis.report import write_results

PEERS = ['swin-t', 'pvtv2-b2', 'pvtv2-b2-li', 'xcit-s12']
DEFAULT_MODELS = ['soft-tiny', 'soft-small', 'ufo-vit-tiny', 'ufo-vit-small',
                  *PEERS]
DEFAULT_SIZES = ['512x512', '800x1333', '1024x1024', '1536x1536', '2048x2048']


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='*', default=DEFAULT_MODELS,
                        help='backbone specs, NAME[:key=value,...]; NAME is one '
                        f'of {", ".join(BACKBONES)} (default: '
                        f'{" ".join(DEFAULT_MODELS)}; the peers: {" ".join(PEERS)})')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help='input sizes HxW')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available()
                        else 'cpu')
    parser.add_argument('--mode', choices=('inference', 'train'),
                        default='inference',
                        help='backbone forward without gradients, or forward + '
                        'backward (training)')
    parser.add_argument('--backward', action='store_true',
                        help='the same as --mode train')
    parser.add_argument('--batch', type=int, default=1,
                        help='images per backbone call')
    parser.add_argument('--detectors', nargs='*', default=[],
                        choices=sorted(DETECTOR_CONFIGS),
                        help='Mask R-CNN 1x detectors to measure one training '
                        'iteration of (the peers: ' + ' '.join(PEERS) + ')')
    parser.add_argument('--detector-sizes', nargs='+', type=parse_size,
                        default=[(800, 1333)], help='detector image sizes HxW')
    parser.add_argument('--detector-batch', type=int, default=2)
    parser.add_argument('--peak-sizes', nargs='*', type=parse_size, default=[],
                        help='sizes HxW at which only the training peak of each '
                        'backbone is measured, untimed (peaks.csv)')
    parser.add_argument('--capacity-size', type=parse_size, default=None,
                        help='size HxW at which to find each backbone\'s largest '
                        'training batch')
    parser.add_argument('--memory-limit-gb', type=float, default=16,
                        help='memory budget of --capacity-size (GB, 1e9 bytes)')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--compile', nargs='?', const='inductor', default=None,
                        metavar='BACKEND',
                        help='measure each backbone a second time compiled '
                        '(torch.compile with BACKEND, default inductor): time, '
                        'peaks and the first call, which compiles')
    parser.add_argument('--flops', action='store_true',
                        help='also count FLOPs of each run')
    parser.add_argument('--no-live-memory', action='store_true',
                        help='on CPU, skip the second run of each measurement '
                        'that finds the peak of live memory')
    parser.add_argument('--timeout', type=float, default=900,
                        help='seconds allowed per measurement')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    return parser.parse_args()


def run_command(command, base, timeout):
    """Runs a worker; returns its ``RESULT`` or ``base`` with the error."""
    try:
        done = subprocess.run(command, env=worker_env(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(base, seconds=None, error=f'timeout after {timeout}s')
    for line in done.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    if done.returncode < 0:
        return dict(base, seconds=None, error=f'killed by signal {-done.returncode}')
    errors = [line for line in done.stderr.splitlines() if 'Error' in line]
    tail = errors[-1:] or done.stderr.strip().splitlines()[-1:]
    return dict(base, seconds=None, error=tail[0] if tail else f'exit {done.returncode}')


def measures_live_memory(args) -> bool:
    """Whether each measurement gets a second, live-memory run."""
    return args.device == 'cpu' and not args.no_live_memory


def with_live_peak(command, base, args):
    """Runs a worker, then (on CPU) the same with ``--live-memory``, and
    returns the first result with ``live_peak_bytes`` from the second."""
    result = run_command(command, base, args.timeout)
    if result.get('seconds') is None or not measures_live_memory(args):
        return result
    live = run_command(command + ['--live-memory'], base, args.timeout)
    if 'peak_bytes' not in live:
        return dict(result, error=f"live memory: {live.get('error')}")
    return dict(result, live_peak_bytes=live['peak_bytes'])


def backbone_command(spec, size, args, batch, warmup, repeats, backward):
    """The worker command line measuring one backbone (spec, size, batch)."""
    command = worker_command('measure', spec, str(size[0]), str(size[1]),
                             '--device', args.device, '--warmup', str(warmup),
                             '--repeats', str(repeats), '--batch', str(batch))
    return command + ['--backward'] * backward


def backbone_base(spec, size, args, batch):
    """What a failed backbone measurement still reports."""
    return dict(model=spec, height=size[0], width=size[1], device=args.device,
                batch=batch)


def run_worker(spec, size, args, batch=None, compile_backend=None):
    """Measures one (spec, size) in child processes, eager or compiled with
    ``compile_backend``; returns its result."""
    batch = args.batch if batch is None else batch
    command = backbone_command(spec, size, args, batch, args.warmup, args.repeats,
                               backward=args.mode == 'train')
    command += ['--flops'] * (args.flops and compile_backend is None)
    base = backbone_base(spec, size, args, batch)
    if compile_backend is not None:
        command += ['--compile', compile_backend]
        base['compile'] = compile_backend
    return with_live_peak(command, base, args)


def run_detector_worker(name, size, args):
    """Measures one detector training iteration in child processes."""
    command = worker_command('detector_step', name, str(size[0]), str(size[1]),
                             '--batch', str(args.detector_batch), '--device',
                             args.device, '--warmup', str(args.warmup),
                             '--repeats', str(args.repeats))
    base = dict(model=name, height=size[0], width=size[1], device=args.device,
                mode='train_step', batch=args.detector_batch)
    return with_live_peak(command, base, args)


def peak_only(spec, size, args, batch):
    """The training peak of one (spec, size, batch), untimed: the live peak
    on CPU (unless ``--no-live-memory``), the device's peak otherwise."""
    command = backbone_command(spec, size, args, batch, 0, 0, backward=True)
    command += ['--live-memory'] * measures_live_memory(args)
    return run_command(command, backbone_base(spec, size, args, batch), args.timeout)


def capacity_of(spec, args):
    """The largest training batch of ``spec`` within the memory limit."""
    size = args.capacity_size
    peaks = {}
    for batch in (1, 2):
        result = peak_only(spec, size, args, batch)
        if 'peak_bytes' not in result:
            return dict(model=spec, error=result['error'])
        peaks[batch] = result['peak_bytes']
    found = largest_batch(peaks, int(args.memory_limit_gb * 1e9))
    kind = 'live peaks' if measures_live_memory(args) else 'peaks'
    return dict(model=spec, height=size[0], width=size[1],
                limit_gb=args.memory_limit_gb,
                method=f'linear from the {kind} of batches 1 and 2',
                peaks=peaks, **found)


def describe(result):
    """One line of progress for a measurement."""
    if result.get('seconds') is None:
        return f"failed: {result['error']}"
    line = f"{result['seconds']:.3f} s, {result['peak_bytes'] / 2**20:.0f} MiB"
    if result.get('compile_seconds') is not None:
        line = f"compiled in {result['compile_seconds']:.1f} s, " + line
    if 'live_peak_bytes' in result:
        line += f" ({result['live_peak_bytes'] / 2**20:.0f} MiB live)"
    return line


def main():
    args = parse_args()
    if args.backward:
        args.mode = 'train'
    for spec in args.models:
        parse_spec(spec)  # fail early on unknown names
    meta = dict(device=args.device, torch=torch.__version__,
                machine=platform.machine(), processor=platform.processor(),
                threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
                mode='forward+backward' if args.mode == 'train' else 'forward',
                batch=args.batch, warmup=args.warmup, repeats=args.repeats,
                date=time.strftime('%Y-%m-%d %H:%M'))
    meta['matmul_gmacs'] = matmul_throughput(device=args.device) / 1e9
    print(f"dense matmul throughput: {meta['matmul_gmacs']:.1f} G multiply-adds/s "
          f"({meta['threads']} threads)", flush=True)
    compiles = [None] + [args.compile] * (args.compile is not None)
    jobs = [('backbone', spec, size, backend) for spec in args.models
            for size in args.sizes for backend in compiles]
    jobs += [('detector', name, size, None) for name in args.detectors
             for size in args.detector_sizes]
    sections = dict(results=[], detectors=[], capacity=[], peaks=[])
    for index, (kind, name, size, backend) in enumerate(jobs, 1):
        compiled = f' compiled ({backend})' if backend else ''
        print(f'[{index}/{len(jobs)}] {name} {size[0]}x{size[1]}{compiled} ...',
              end=' ', flush=True)
        if kind == 'backbone':
            result = run_worker(name, size, args, compile_backend=backend)
            sections['results'].append(result)
        else:
            result = run_detector_worker(name, size, args)
            sections['detectors'].append(result)
        print(describe(result), flush=True)
        write_results(sections['results'], meta, args.out_dir,
                      sections['detectors'], sections['capacity'])
    for spec in args.models:
        for size in args.peak_sizes:
            result = peak_only(spec, size, args, args.batch)
            sections['peaks'].append(result)
            print(f'{spec} {size[0]}x{size[1]}: training peak ' + (
                f"{result['peak_bytes'] / 2**20:.0f} MiB" if 'peak_bytes' in result
                else f"failed: {result['error']}"), flush=True)
    if args.capacity_size is not None:
        args.mode = 'train'
        for spec in args.models:
            found = capacity_of(spec, args)
            sections['capacity'].append(found)
            print(f"{spec}: largest batch at {args.capacity_size[0]}x"
                  f"{args.capacity_size[1]} within {args.memory_limit_gb} GB: "
                  f"{found.get('largest_batch', found.get('error'))}", flush=True)
    paths = write_results(sections['results'], meta, args.out_dir,
                          sections['detectors'], sections['capacity'],
                          sections['peaks'])
    print('written: ' + ', '.join(paths.values()))


if __name__ == '__main__':
    main()
