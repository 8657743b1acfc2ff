"""Latency and peak memory of backbones at several input sizes, side by side.

Each (backbone, size) is measured in a fresh process (peak memory is then
that call's own); SOFT and UFO-ViT run next to mmdet's Swin-T and PVTv2-b2
built in the same environment. Results: ``results.json``, ``results.csv`` and
``scaling.png`` (time and memory against the pixel count) in ``--out-dir``.

Example::

    python tools/analysis/benchmark.py --models soft-tiny soft-small swin-t pvtv2-b2 \
        --sizes 512x512 800x1333 1024x1024 --repeats 3
    python tools/analysis/benchmark.py --models soft-small:solver=newton --sizes 800x1333
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

from mmsoft.analysis.measure import matmul_throughput, parse_size
from mmsoft.analysis.peers import parse_spec
from mmsoft.analysis.report import write_results

DEFAULT_MODELS = ['soft-tiny', 'soft-small', 'ufo-vit-tiny', 'ufo-vit-small',
                  'swin-t', 'pvtv2-b2']
DEFAULT_SIZES = ['512x512', '800x1333', '1024x1024', '1536x1536', '2048x2048']


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS,
                        help='backbone specs, NAME[:key=value,...]')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help='input sizes HxW')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available()
                        else 'cpu')
    parser.add_argument('--backward', action='store_true',
                        help='time forward + backward (training) instead')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--flops', action='store_true',
                        help='also count FLOPs of each run')
    parser.add_argument('--timeout', type=float, default=900,
                        help='seconds allowed per measurement')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    return parser.parse_args()


def run_worker(spec, size, args):
    """Measures one (spec, size) in a child process; returns its result."""
    command = [sys.executable, '-m', 'mmsoft.analysis.measure', spec, str(size[0]),
               str(size[1]), '--device', args.device, '--warmup',
               str(args.warmup), '--repeats', str(args.repeats)]
    command += ['--backward'] * args.backward + ['--flops'] * args.flops
    base = dict(model=spec, height=size[0], width=size[1], device=args.device)
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(base, seconds=None, error=f'timeout after {args.timeout}s')
    for line in done.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    if done.returncode < 0:
        return dict(base, seconds=None, error=f'killed by signal {-done.returncode}')
    errors = [line for line in done.stderr.splitlines() if 'Error' in line]
    tail = errors[-1:] or done.stderr.strip().splitlines()[-1:]
    return dict(base, seconds=None, error=tail[0] if tail else f'exit {done.returncode}')


def main():
    args = parse_args()
    for spec in args.models:
        parse_spec(spec)  # fail early on unknown names
    meta = dict(device=args.device, torch=torch.__version__,
                machine=platform.machine(), processor=platform.processor(),
                threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
                mode='forward+backward' if args.backward else 'forward',
                warmup=args.warmup, repeats=args.repeats,
                date=time.strftime('%Y-%m-%d %H:%M'))
    meta['matmul_gmacs'] = matmul_throughput(device=args.device) / 1e9
    print(f"dense matmul throughput: {meta['matmul_gmacs']:.1f} G multiply-adds/s "
          f"({meta['threads']} threads)", flush=True)
    jobs = [(spec, size) for spec in args.models for size in args.sizes]
    results = []
    for index, (spec, size) in enumerate(jobs, 1):
        print(f'[{index}/{len(jobs)}] {spec} {size[0]}x{size[1]} ...', end=' ',
              flush=True)
        result = run_worker(spec, size, args)
        results.append(result)
        if result.get('seconds') is None:
            print(f"failed: {result['error']}", flush=True)
        else:
            print(f"{result['seconds']:.3f} s, "
                  f"{result['peak_bytes'] / 2**20:.0f} MiB", flush=True)
        write_results(results, meta, args.out_dir)
    paths = write_results(results, meta, args.out_dir)
    print('written: ' + ', '.join(paths.values()))


if __name__ == '__main__':
    main()
