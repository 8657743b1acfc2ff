"""Interleaved A/B: the same step of two or more variants of a backbone, in turns.

Each variant runs in a process of its own, built once and kept: the run
asks each in turn for one timed step (inference call, or training step:
forward, the sum of the maps' means as the loss, backward), round after
round, the order reversed every other round, so that a drift of the
machine's speed falls on all variants alike. Then each variant's peak of
live memory over one step is measured in a fresh process (on the CPU with
glibc's mmap threshold fixed, :func:`mmsoft_analysis.measure.track_live_memory`;
on a GPU ``max_memory_allocated``).

A variant is ``LABEL=ITEM,ITEM,...`` (``LABEL=`` alone: the backbone as
built), each item one of

- ``key=value``: an argument of mmsoft's backbone (a Python literal, e.g.
  ``memory_efficient=False``, ``solver='newton'``);
- ``plain:Class/Class``: the modules of those classes run their plain
  autograd path (``memory_efficient = False`` on them alone);
- ``root:PATH``: mmsoft imported from another checkout at PATH (for
  before/after comparisons of the code);
- ``backbone:NAME``: another backbone than ``--backbone`` (a peer, say);
- ``use:DOTTED=DOTTED``: the function of the second dotted name in place of
  the first, in every module of mmsoft that refers to it (the plain twin of a
  memory-saving function, say);
- ``checkpointing``: block-level gradient checkpointing on
  (``set_grad_checkpointing``);
- ``compile``: the model through ``torch.compile`` (compiled in the
  warm-up calls).

Prints and appends to ``--out`` (JSON lines) each variant's median wall
time and process CPU time (less disturbed by other work on a shared
machine), their median ratios to the first variant's over the rounds, and
its peak of live memory and ratio.

Example::

    python tools/analysis/ab_compare.py --backbone soft++-tiny --mode train \\
        --size 1536x1536 --variant twin= --variant plain=plain:MLP
    python tools/analysis/ab_compare.py --backbone soft++-small --size 800x1333 \\
        --variant new= --variant old=root:/path/to/older/checkout
"""
import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mmsoft_analysis import worker_env
from mmsoft_analysis.gpu_backbones import BACKBONES

from mmsoft_analysis.sizes import parse_size

MODES = ('inference', 'train')


def parse_variant(text: str) -> Tuple[str, Dict]:
    """``LABEL=ITEM,...`` -> (label, dict(kwargs, plain, root)).

    Raises:
        ValueError: A malformed variant or item.
    """
    label, sep, items = text.partition('=')
    if not sep or not label:
        raise ValueError(f'variant {text!r} is invalid; expected LABEL=ITEM,... '
                         f'(LABEL= for the backbone as built).')
    spec = dict(kwargs={}, plain=[], root=None, backbone=None, use=[],
                checkpointing=False, compile=False)
    for item in filter(None, items.split(',')):
        if item in ('checkpointing', 'compile'):
            spec[item] = True
        elif item.startswith('backbone:'):
            spec['backbone'] = item[9:]
            if spec['backbone'] not in BACKBONES:
                raise ValueError(f'backbone:{spec["backbone"]} in variant {text!r} is '
                                 f'not known; expected one of {BACKBONES}.')
        elif item.startswith('use:') and '=' in item:
            spec['use'].append(item[4:].split('=', 1))
        elif item.startswith('plain:'):
            spec['plain'] += [name for name in item[6:].split('/') if name]
        elif item.startswith('root:'):
            spec['root'] = str(Path(item[5:]).resolve())
        elif '=' in item:
            key, value = item.split('=', 1)
            try:
                spec['kwargs'][key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                spec['kwargs'][key] = value
        else:
            raise ValueError(f'item {item!r} of variant {text!r} is invalid; expected '
                             f"key=value, 'plain:Class/Class', 'root:PATH', 'backbone:NAME', "
                             f"'use:DOTTED=DOTTED', 'checkpointing' or 'compile'.")
    return label, spec


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--backbone', required=True, choices=BACKBONES)
    parser.add_argument('--variant', action='append', required=True,
                        help='LABEL=ITEM,... (at least two)')
    parser.add_argument('--mode', choices=MODES, default='inference')
    parser.add_argument('--size', default='800x1333', help='HxW')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--valid-shapes', nargs='+', default=None, metavar='HxW',
                        help="each image's valid region in the padded batch, as "
                        "mmdet passes it to mmsoft's backbones (one per image)")
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--no-memory', action='store_true',
                        help='time only, skip the live-memory processes')
    parser.add_argument('--out', default='work_dirs/ab_compare.jsonl',
                        help='JSON lines file the result is appended to')
    parser.add_argument('--worker', metavar='SPEC', help=argparse.SUPPRESS)
    parser.add_argument('--live-memory', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parse_size(args.size)
    if args.valid_shapes is not None and len(args.valid_shapes) != args.batch:
        raise ValueError(f'--valid-shapes {" ".join(args.valid_shapes)} names '
                         f'{len(args.valid_shapes)} regions; expected one per image '
                         f'of --batch {args.batch}.')
    if args.worker is None:
        if len(args.variant) < 2:
            parser.error('--variant: give at least two')
        args.variants = [parse_variant(text) for text in args.variant]
    return args


# --- Worker
def build_variant(backbone: str, spec: Dict, device):
    """The backbone of ``spec`` on ``device``."""
    from mmsoft_analysis.gpu_backbones import build_maps
    from mmsoft_analysis.op_profile import resolve, replace_references
    for original, replacement in spec.get('use', []):
        replace_references(original, resolve(replacement)[2])
    backbone = spec.get('backbone') or backbone
    model = build_maps(backbone, **spec['kwargs'])
    plain = set(spec['plain'])
    found = set()
    for module in model.modules():
        if type(module).__name__ in plain:
            module.memory_efficient = False
            found.add(type(module).__name__)
    missing = plain - found
    if missing:
        raise ValueError(f'plain:{"/".join(sorted(missing))} names no module of '
                         f'{backbone}.')
    if spec.get('checkpointing'):
        model.backbone.set_grad_checkpointing(True)
    return model.to(device)


def run_worker(args) -> None:
    """Serves ``step`` requests on stdin with ``TIME seconds`` lines; with
    ``--live-memory``, prints ``PEAK bytes`` of one step and exits."""
    spec = json.loads(args.worker)
    from mmsoft_analysis.measure import (peak_memory_of, run_once,
                                         track_live_memory, _synchronize)
    if args.live_memory and args.device == 'cpu':
        track_live_memory()
    import torch
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    import mmsoft
    if spec['root'] and not mmsoft.__file__.startswith(spec['root']):
        raise RuntimeError(f'mmsoft was imported from {mmsoft.__file__}, not from '
                           f'{spec["root"]}.')
    model = build_variant(args.backbone, spec, device)
    if args.valid_shapes and model.takes_valid_shapes:
        model.valid_shapes = [parse_size(shape) for shape in args.valid_shapes]
    backward = args.mode == 'train'
    model.train(backward)
    if spec.get('compile'):
        model = torch.compile(model)
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, *parse_size(args.size), device=device)
    step = lambda: run_once(model, images, backward)  # noqa: E731
    if args.live_memory:
        print(f'PEAK {peak_memory_of(step, device)}', flush=True)
        return
    for _ in range(args.warmup):
        step()
    print('READY', flush=True)
    for line in sys.stdin:
        if line.strip() != 'step':
            break
        _synchronize(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        _synchronize(device)
        print(f'TIME {time.perf_counter() - start} {time.process_time() - start_cpu}',
              flush=True)


# --- Driver
def _worker_env(spec: Dict) -> Dict[str, str]:
    """The workers' environment: ``spec['root']`` first on ``PYTHONPATH``."""
    env = worker_env()
    if spec['root']:
        env['PYTHONPATH'] = os.pathsep.join((spec['root'], env['PYTHONPATH']))
    return env


def _worker_command(args, spec: Dict, live_memory: bool) -> List[str]:
    command = [sys.executable, __file__, '--worker', json.dumps(spec),
               '--variant', 'worker=', '--backbone', args.backbone,
               '--mode', args.mode, '--size', args.size, '--batch', str(args.batch),
               *(['--valid-shapes', *args.valid_shapes] if args.valid_shapes else []),
               '--warmup', str(args.warmup), '--threads', str(args.threads),
               '--device', args.device]
    return command + (['--live-memory'] if live_memory else [])


def _expect(process: subprocess.Popen, prefix: str) -> str:
    for line in process.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise RuntimeError(f'a worker ended before {prefix.strip()!r}: '
                       f'{process.stderr.read()[-2000:]}')


def time_variants(args) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """Wall and process CPU seconds of each variant's steps, round by round."""
    processes = {}
    for label, spec in args.variants:
        processes[label] = subprocess.Popen(
            _worker_command(args, spec, False), env=_worker_env(spec), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for process in processes.values():
            _expect(process, 'READY')
        times = {label: [] for label in processes}
        cpu_times = {label: [] for label in processes}
        labels = list(processes)
        for round_index in range(args.rounds):
            order = labels if round_index % 2 == 0 else labels[::-1]
            for label in order:
                processes[label].stdin.write('step\n')
                processes[label].stdin.flush()
                wall, cpu = _expect(processes[label], 'TIME ').split()
                times[label].append(float(wall))
                cpu_times[label].append(float(cpu))
            print(f'round {round_index + 1}: ' + ', '.join(
                f'{label} {times[label][-1] * 1e3:.0f} ms '
                f'(CPU {cpu_times[label][-1] * 1e3:.0f} ms)' for label in labels),
                flush=True)
        return times, cpu_times
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.stdin.close()
                process.wait(timeout=60)


def live_peak(args, spec: Dict) -> Optional[int]:
    done = subprocess.run(_worker_command(args, spec, True), env=_worker_env(spec),
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith('PEAK ')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f'the live-memory worker failed: {done.stderr[-2000:]}')
    return int(lines[-1][5:])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        run_worker(args)
        return 0
    import torch
    times, cpu_times = time_variants(args)
    first = args.variants[0][0]
    peaks = {} if args.no_memory else {
        label: live_peak(args, spec) for label, spec in args.variants}
    record = dict(date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
                  command='python tools/analysis/ab_compare.py ' + ' '.join(
                      sys.argv[1:] if argv is None else argv),
                  torch=torch.__version__, device=args.device, threads=args.threads,
                  backbone=args.backbone, mode=args.mode, size=args.size,
                  batch=args.batch, rounds=args.rounds, variants={})
    for label, spec in args.variants:
        ratios = [mine / base for mine, base in zip(times[label], times[first])]
        cpu_ratios = [mine / base for mine, base in zip(cpu_times[label],
                                                         cpu_times[first])]
        entry = dict(spec=spec, seconds=statistics.median(times[label]),
                     all_seconds=times[label], time_ratio=statistics.median(ratios),
                     cpu_seconds=statistics.median(cpu_times[label]),
                     all_cpu_seconds=cpu_times[label],
                     cpu_time_ratio=statistics.median(cpu_ratios))
        if peaks:
            entry.update(live_peak_bytes=peaks[label],
                         memory_ratio=peaks[label] / peaks[first])
        record['variants'][label] = entry
        memory = (f", live peak {peaks[label] / 2**20:.0f} MiB "
                  f"({entry['memory_ratio']:.3f}x)" if peaks else '')
        print(f'{label}: {entry["seconds"] * 1e3:.0f} ms ({entry["time_ratio"]:.3f}x '
              f'{first}; CPU time {entry["cpu_seconds"] * 1e3:.0f} ms, '
              f'{entry["cpu_time_ratio"]:.3f}x){memory}')
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open('a') as stream:
        stream.write(json.dumps(record) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
