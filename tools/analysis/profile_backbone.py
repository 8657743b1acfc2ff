"""Where each backbone's time goes: a per-operator, per-region profile.

Profiles one inference call and one training step (forward and backward,
the sum of the maps' means as the loss) of each backbone at each size, each
case in its own process, one after another in the same run: mmsoft's
SOFT++-tiny, SOFT++-small and UFO-ViT-small (the settings of their COCO
configs) and timm's Swin-T, PVTv2-b2 and PVTv2-b2-li (``features_only``),
built as :mod:`mmsoft_analysis.gpu_backbones` builds them (torch and timm
only). Each operator's own time and FLOPs go to its operator class and to
the region of the model that ran it (:mod:`mmsoft_analysis.op_profile`);
the machine's float32 matmul rate, measured in the same run, turns FLOPs
into the time they would take at that rate.

Writes ``profile.json`` (everything), ``profile.md`` (the tables) and
``profile.png`` (time by region against the time of the FLOPs at the
matmul rate) into ``--out-dir``.

Example::

    python tools/analysis/profile_backbone.py                 # the whole profile
    python tools/analysis/profile_backbone.py --backbones soft++-tiny swin-t \\
        --sizes 800x1333 --modes inference
"""
import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List

from mmsoft_analysis import worker_env
from mmsoft_analysis.gpu_backbones import BACKBONES
from mmsoft_analysis.op_profile import CLASS_ORDER, REGION_ORDER

from mmsoft_analysis.sizes import parse_size

DEFAULT_BACKBONES = ('soft++-tiny', 'soft++-small', 'ufo-vit-small', 'swin-t',
                     'pvtv2-b2', 'pvtv2-b2-li')
DEFAULT_SIZES = ('800x1333', '1536x1536')
MODES = ('inference', 'train')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--backbones', nargs='+', default=list(DEFAULT_BACKBONES),
                        choices=BACKBONES)
    parser.add_argument('--sizes', nargs='+', default=list(DEFAULT_SIZES),
                        help='input sizes HxW')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--device', default='cpu', help="'cpu' or 'cuda'")
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads on the CPU (default 1)')
    parser.add_argument('--batch', type=int, default=1, help='images per call')
    parser.add_argument('--repeats', type=int, default=3,
                        help='unprofiled timed calls (median reported)')
    parser.add_argument('--timeout', type=float, default=1800,
                        help='seconds allowed per case')
    parser.add_argument('--out-dir', default='work_dirs/profile')
    parser.add_argument('--report', metavar='JSON',
                        help='only write profile.md and profile.png again from a '
                        'profile.json, beside it')
    parser.add_argument('--worker', nargs=3, metavar=('BACKBONE', 'SIZE', 'MODE'),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for size in args.sizes:
        parse_size(size)  # raises on a malformed size
    return args


def run_worker(args) -> None:
    """Profiles one case in this process and prints its result as JSON."""
    import torch
    from mmsoft_analysis.gpu_backbones import build_maps
    from mmsoft_analysis.op_profile import profile_step
    name, size, mode = args.worker
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = build_maps(name).to(device)
    height, width = parse_size(size)
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, height, width, device=device)
    result = profile_step(model, images, mode, repeats=args.repeats)
    result.update(backbone=name, size=size, mode=mode)
    print('RESULT ' + json.dumps(result))


def matmul_rate(device: str, threads: int) -> float:
    """float32 FLOP/s of a 2048^3 matmul here (best of 5), in a fresh process."""
    code = ('import torch, sys; sys.path.insert(0, sys.argv[1]); '
            f'torch.set_num_threads({threads}); '
            'from mmsoft_analysis.measure import matmul_throughput; '
            f'print(2 * matmul_throughput(device={device!r}))')
    done = subprocess.run([sys.executable, '-c', code, str(Path(__file__).parent)],
                          env=worker_env(), capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def run_case(args, name: str, size: str, mode: str) -> Dict:
    command = [sys.executable, __file__, '--worker', name, size, mode,
               '--device', args.device, '--threads', str(args.threads),
               '--batch', str(args.batch), '--repeats', str(args.repeats)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=worker_env(), capture_output=True,
                              text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(backbone=name, size=size, mode=mode,
                    error=f'timed out after {args.timeout:.0f} s')
    lines = [line for line in done.stdout.splitlines() if line.startswith('RESULT ')]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return dict(backbone=name, size=size, mode=mode,
                    error=f'exit {done.returncode}: ' + ' | '.join(tail))
    result = json.loads(lines[-1][len('RESULT '):])
    result['case_seconds'] = time.perf_counter() - start
    return result


# --- Report
def _shares(result: Dict, table: str) -> Dict[str, Dict[str, float]]:
    """name -> ms (of the unprofiled median, by profiled share), time and
    FLOP shares, GFLOP."""
    entries = result[table]
    total_us = sum(entry['us'] for entry in entries.values()) or 1.
    total_flops = sum(entry['flops'] for entry in entries.values()) or 1
    scale = result['seconds'] * 1e3 / total_us
    return {name: dict(ms=entry['us'] * scale, time=entry['us'] / total_us,
                       flops=entry['flops'] / total_flops,
                       gflop=entry['flops'] / 1e9)
            for name, entry in entries.items()}


def _ordered(names, order) -> List[str]:
    known = [name for name in order if name in names]
    return known + sorted(name for name in names if name not in order)


def summary_rows(results: List[Dict], rate: float) -> List[Dict]:
    """Per case: time, GFLOP, the time of those FLOPs at ``rate``, its ratio."""
    rows = []
    for result in results:
        if 'error' in result:
            rows.append(dict(result, gflop=None))
            continue
        flops = sum(entry['flops'] for entry in result['regions'].values())
        arithmetic = sum(result['classes'].get(name, {}).get('us', 0.)
                         for name in ('matrix products', 'convolutions',
                                      'fused attention'))
        total = sum(entry['us'] for entry in result['classes'].values()) or 1.
        rows.append(dict(backbone=result['backbone'], size=result['size'],
                         mode=result['mode'], ms=result['seconds'] * 1e3,
                         gflop=flops / 1e9, flop_ms=flops / rate * 1e3,
                         bulk_share=arithmetic / total))
    return rows


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
    return lines


def _machine(meta: Dict) -> str:
    if meta['device'].startswith('cuda'):
        return meta['device_name']
    return f"{meta['device_name']}, {meta['threads']} thread(s)"


def write_markdown(path: Path, results: List[Dict], meta: Dict) -> None:
    rate = meta['matmul_flops_per_s']
    lines = [f"# Profile: {_machine(meta)}, torch {meta['torch']}, {meta['date']}", '',
             f"Command: `{meta['command']}`. Matmul rate here: "
             f'{rate / 1e9:.1f} GFLOP/s (float32, 2048^3, best of 5). Times: '
             'median of the unprofiled calls; shares: of one profiled call. '
             'FLOPs: matrix products, convolutions and fused attention, '
             '2 per multiply-add.' + (f" {meta['note']}" if meta.get('note') else ''),
             '']
    rows = summary_rows(results, rate)
    lines += ['## Time against FLOPs', '']
    lines += _table(
        ['backbone', 'mode', 'size', 'ms', 'GFLOP', 'ms at matmul rate',
         'time / FLOP time', 'share in bulk arithmetic'],
        [[row['backbone'], row['mode'], row['size'],
          f"{row['ms']:.0f}" if row.get('gflop') is not None else row.get('error', ''),
          f"{row['gflop']:.1f}" if row.get('gflop') is not None else '-',
          f"{row['flop_ms']:.0f}" if row.get('gflop') is not None else '-',
          f"{row['ms'] / row['flop_ms']:.2f}" if row.get('gflop') else '-',
          f"{100 * row['bulk_share']:.0f}%" if row.get('gflop') is not None else '-']
         for row in rows])
    for mode in meta['modes']:
        for size in meta['sizes']:
            cases = [r for r in results if r['mode'] == mode and r['size'] == size
                     and 'error' not in r]
            if not cases:
                continue
            for table, order, title in (('regions', REGION_ORDER, 'region'),
                                        ('classes', CLASS_ORDER, 'operator class')):
                shares = [_shares(case, table) for case in cases]
                names = _ordered(set().union(*shares), order)
                lines += ['', f'## {mode}, {size}: by {title}', '',
                          'Each cell: ms, share of time / share of FLOPs.', '']
                lines += _table(
                    [title] + [case['backbone'] for case in cases],
                    [[name] + [
                        (f"{share[name]['ms']:.0f} ({100 * share[name]['time']:.0f}% "
                         f"/ {100 * share[name]['flops']:.0f}%)") if name in share else '-'
                        for share in shares] for name in names])
    path.write_text('\n'.join(lines) + '\n')


def write_plot(path: Path, results: List[Dict], meta: Dict) -> None:
    """Per mode and size: each backbone's time by region (upper bar) and the
    time its FLOPs take at the matmul rate (lower bar), in ms."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rate = meta['matmul_flops_per_s']
    panels = [(mode, size) for mode in meta['modes'] for size in meta['sizes']]
    regions = _ordered({name for r in results if 'error' not in r for name in r['regions']},
                       REGION_ORDER)
    colors = dict(zip(regions, plt.get_cmap('tab20').colors))
    figure, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)),
                                squeeze=False)
    for axis, (mode, size) in zip(axes[:, 0], panels):
        cases = [r for r in results if r['mode'] == mode and r['size'] == size
                 and 'error' not in r]
        for row, case in enumerate(cases):
            shares = _shares(case, 'regions')
            left = flop_left = 0.
            for region in regions:
                if region not in shares:
                    continue
                width = shares[region]['ms']
                axis.barh(row + 0.18, width, height=0.34, left=left, color=colors[region],
                          label=region if row == 0 else None)
                flop_width = case['regions'][region]['flops'] / rate * 1e3
                axis.barh(row - 0.2, flop_width, height=0.22, left=flop_left,
                          color=colors[region], alpha=0.55)
                left += width
                flop_left += flop_width
        axis.set_yticks(range(len(cases)), [case['backbone'] for case in cases])
        axis.invert_yaxis()
        axis.set_xlabel('ms (thick bar: measured; thin bar: the time of its FLOPs at '
                        f'the matmul rate, {rate / 1e9:.0f} GFLOP/s)')
        axis.set_title(f'{mode}, {size}')
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc='lower center', ncol=4, fontsize=8,
                  bbox_to_anchor=(0.5, 0.0))
    figure.suptitle(f"Where the time goes: {_machine(meta)}, torch {meta['torch']}, "
                    f"{meta['date']}")
    figure.tight_layout(rect=(0, 0.04 + 0.02 * (len(regions) // 4), 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def device_name(device: str) -> str:
    import torch
    if device.startswith('cuda'):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open('/proc/cpuinfo') as cpuinfo:
            for line in cpuinfo:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'CPU'


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    if args.report:
        recorded = json.loads(Path(args.report).read_text())
        write_report(Path(args.report).parent, recorded['results'], recorded['meta'])
        return 0
    import torch
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(command='python tools/analysis/profile_backbone.py '
                + ' '.join(sys.argv[1:] if argv is None else argv),
                date=datetime.now(timezone.utc).strftime('%Y-%m-%d'),
                torch=torch.__version__, python=platform.python_version(),
                device=args.device, device_name=device_name(args.device),
                threads=args.threads, batch=args.batch, sizes=args.sizes,
                modes=args.modes, backbones=args.backbones)
    meta['matmul_flops_per_s'] = matmul_rate(args.device, args.threads)
    print(f"matmul rate: {meta['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    results = []
    for mode in args.modes:
        for size in args.sizes:
            for name in args.backbones:
                result = run_case(args, name, size, mode)
                results.append(result)
                if 'error' in result:
                    print(f'{name} {mode} {size}: {result["error"]}', flush=True)
                else:
                    print(f'{name} {mode} {size}: {result["seconds"] * 1e3:.0f} ms',
                          flush=True)
                (out_dir / 'profile.json').write_text(
                    json.dumps(dict(meta=meta, results=results), indent=1))
    write_report(out_dir, results, meta)
    return 1 if any('error' in result for result in results) else 0


def write_report(out_dir: Path, results: List[Dict], meta: Dict) -> None:
    """``profile.md`` and, where matplotlib is installed, ``profile.png``."""
    write_markdown(out_dir / 'profile.md', results, meta)
    written = ['profile.json', 'profile.md']
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('matplotlib is not installed here: no profile.png; draw it where it is '
              f'with --report {out_dir / "profile.json"}')
    else:
        write_plot(out_dir / 'profile.png', results, meta)
        written.append('profile.png')
    print(f'written in {out_dir}: {", ".join(written)}')


if __name__ == '__main__':
    sys.exit(main())
