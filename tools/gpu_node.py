"""What ``tools/gpu_node.sh`` runs in Python, with the node's interpreter or
the build environment's (docs/gpu.md); ``python tools/gpu_node.py -h`` lists
its commands.

Exit status 0, or 1 naming the check that failed, or 2 on invalid arguments;
``device``: 10 without torch, 11 for a torch without CUDA, 12 when no GPU is
visible; ``node``: 2 for an unreadable manifest, 3 naming what does not match.
"""
import argparse
import glob
import importlib
import json
import os
import os.path as osp
import re
import struct
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional

#: Distributions whose import name is not their own.
MODULES = {'pillow': 'PIL', 'opencv-python': 'cv2', 'opencv-python-headless': 'cv2'}
MANIFEST = 'gpu-train-manifest.json'
NODE_LIST = 'gpu-train-node.txt'
#: The run every other run's time is compared with, where it was measured.
BASELINE = 'swin-t'
#: The keys of a table's ``--run``; the last three are optional.
RUN_KEYS = ('label', 'work_dir', 'batch', 'size', 'metrics', 'status', 'config')
METRICS = ('coco/bbox_mAP', 'coco/segm_mAP')
#: A run's ``status`` in the table; any other is an exit status of a failure.
STATUS = {None: 'ok', '0': 'ok', '124': 'stopped by the budget',
          'skipped': 'skipped (no budget left)'}


class Refused(Exception):
    """A check that failed: ``Refused(exit_status, message)``."""


# --- The node
def device() -> str:
    """The node's torch and GPU in one line; refused with 10 without torch,
    11 for a CPU-only torch, 12 without a visible GPU."""
    where = f'{sys.executable} (Python {sys.version.split()[0]})'
    try:
        import torch
    except Exception as error:  # any import failure means: no usable torch
        raise Refused(10, f'no torch: {where} cannot import torch '
                          f'({type(error).__name__}: {error})')
    build = f'torch {torch.__version__} in {where}'
    if torch.version.cuda is None and getattr(torch.version, 'hip', None) is None:
        raise Refused(11, f'torch without CUDA: {build} is a CPU-only build '
                          '(torch.version.cuda is None)')
    if not torch.cuda.is_available():
        visible = os.environ.get('CUDA_VISIBLE_DEVICES')
        raise Refused(12, f'no GPU visible: {build}, built for CUDA '
                          f'{torch.version.cuda}, sees no device '
                          '(torch.cuda.is_available() is False'
                          + ('' if visible is None else
                             f', CUDA_VISIBLE_DEVICES={visible!r}') + ')')
    return (f'{build}, CUDA {torch.version.cuda}: {torch.cuda.device_count()} '
            f'device(s), {torch.cuda.get_device_name(0)}')


def requirement_names(path: str) -> List[str]:
    """The distribution names of a requirements file, in order."""
    with open(path) as file:
        return [match[0] for match in map(re.compile(r'[A-Za-z0-9][\w.-]*').match, file)
                if match]


def check_node(bundle: str) -> str:
    """What the node provides for a training bundle; refused with 2 for an
    unreadable manifest, 3 naming the packages that do not import or the
    node's torch where the bundle's mmcv was compiled against another."""
    import torch
    try:
        with open(osp.join(bundle, MANIFEST)) as file:
            built = json.load(file)['mmcv']
        built_torch, built_cuda = built['torch'], str(built['cuda'])
    except (OSError, ValueError, KeyError) as error:
        raise Refused(2, f'bundle: {MANIFEST} is unreadable ({type(error).__name__}: '
                         f'{error})')
    problems = []
    node_cuda = torch.version.cuda or 'none'
    release = lambda version: version.split('+')[0].split('.')[:2]  # noqa: E731
    if (release(torch.__version__) != release(built_torch)
            or node_cuda.split('.')[0] != built_cuda.split('.')[0]):
        problems.append(
            f"the node's torch {torch.__version__} (CUDA {node_cuda}) is not the torch "
            f"the bundle's mmcv was compiled against, {built_torch} (CUDA "
            f'{built_cuda}): make the bundle with that torch '
            '(requirements/gpu-train-build.txt)')
    wanted: Dict[str, List[str]] = {}
    for name in requirement_names(osp.join(bundle, NODE_LIST)):
        wanted.setdefault(MODULES.get(name.lower(), name.replace('-', '_')),
                          []).append(name)
    for module, names in wanted.items():
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure: the node cannot provide it
            problems.append(f"missing on the node: {' or '.join(names)} (import "
                            f'{module}: {type(error).__name__}: {error})')
    if problems:
        raise Refused(3, '; '.join(problems))
    return (f"the node provides {', '.join(sorted(wanted))}; torch {torch.__version__} "
            f"matches the bundle's mmcv ({built_torch})")


# --- The bundle's manifest (the build environment)
def fatbin_architectures(elf: bytes) -> Dict[str, int]:
    """``{'sm_80': count, ...}``: the machine code (ELF) and PTX images in the
    ``.nv_fatbin`` section of a shared library (ELF64, little-endian)."""
    section_offset, = struct.unpack_from('<Q', elf, 0x28)
    entry_size, count, names = struct.unpack_from('<HHH', elf, 0x3A)
    sections = [struct.unpack_from('<IIQQQQ', elf, section_offset + i * entry_size)
                for i in range(count)]
    table = sections[names][4]
    found: Dict[str, int] = {}
    for name, _, _, _, offset, size in sections:
        if elf[table + name:elf.index(b'\0', table + name)] != b'.nv_fatbin':
            continue
        position, end = offset, offset + size
        while position < end:  # fatbins: a 16-byte header, then entries
            magic, _, header, length = struct.unpack_from('<IHHQ', elf, position)
            if magic != 0xBA55ED50:
                position += 8
                continue
            entry, stop = position + header, position + header + length
            while entry < stop:
                kind, _, entry_header, payload = struct.unpack_from('<HHIQ', elf, entry)
                arch, = struct.unpack_from('<I', elf, entry + 28)
                label = ('ptx_' if kind == 1 else 'sm_') + str(arch)
                found[label] = found.get(label, 0) + 1
                entry += entry_header + payload
            position = stop
    return found


def write_manifest(out: str, key: str, arch_list: str, nvcc: str, built: str,
                   python_version: str, platform: str) -> str:
    """Writes ``out/gpu-train-manifest.json`` for the wheels in ``out``; returns
    a line on mmcv's wheel; refused with 1 when mmcv's compiled ops lack an
    architecture of ``arch_list``."""
    import torch
    wheels = sorted(osp.basename(p) for p in glob.glob(osp.join(out, '*.whl')))
    mmcv = next(w for w in wheels if w.startswith('mmcv-'))
    with zipfile.ZipFile(osp.join(out, mmcv)) as wheel:
        ops = next(n for n in wheel.namelist() if re.match(r'mmcv/_ext.*\.so$', n))
        architectures = fatbin_architectures(wheel.read(ops))
    wanted = {'sm_' + arch.split('+')[0].replace('.', '')
              for arch in re.split('[; ]', arch_list) if arch}
    if not wanted <= set(architectures):
        raise Refused(1, f'{ops} of {mmcv} carries machine code for '
                         f'{sorted(architectures) or "no GPU"}, not for all of '
                         f'{sorted(wanted)} (TORCH_CUDA_ARCH_LIST={arch_list})')
    nvcc_version = re.search(r'release \S+, V(\S+)', subprocess.run(
        [nvcc, '--version'], capture_output=True, text=True, check=True).stdout)[1]
    manifest = dict(
        target=dict(python=python_version, platform=platform),
        mmcv=dict(wheel=mmcv, torch=torch.__version__, cuda=torch.version.cuda,
                  nvcc=nvcc_version, arch_list=arch_list, fatbin=architectures,
                  cache_key=key, compiled_bytes=osp.getsize(built),
                  debug_symbols='stripped'),
        node_packages=requirement_names(osp.join(out, NODE_LIST)),
        wheels=[dict(file=w, bytes=osp.getsize(osp.join(out, w)),
                     origin='built' if w == mmcv else 'gpu-train-lock.txt')
                for w in wheels])
    write_json(osp.join(out, MANIFEST), manifest)
    return (f'{mmcv}: CUDA {torch.version.cuda} (nvcc {nvcc_version}), machine code '
            + ', '.join(f'{a} ({n} images)' for a, n in sorted(architectures.items())))


def write_json(path: str, data: dict) -> None:
    with open(path, 'w') as file:
        json.dump(data, file, indent=2)
        file.write('\n')


# --- mmcv's compiled ops
def check_mmcv_ops(cuda_version: Optional[str], require_cuda: bool) -> str:
    """NMS and RoIAlign on each device, against the expected values; refused
    with 1 naming the check that failed."""
    import mmcv
    import torch
    from mmcv.ops import get_compiling_cuda_version, nms, roi_align
    compiled = get_compiling_cuda_version()
    lines = [f'mmcv {mmcv.__version__} ({mmcv.__file__}), ops compiled with CUDA '
             f'{compiled}; torch {torch.__version__}']
    if cuda_version is not None and compiled != cuda_version:
        raise Refused(1, f'mmcv._ext was compiled with CUDA {compiled!r}, expected '
                         f'{cuda_version!r} (--cuda-version)')
    if require_cuda and not torch.cuda.is_available():
        raise Refused(1, 'no GPU visible (torch.cuda.is_available() is False) and '
                         '--require-cuda was given')
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.],
                          [0., 0., 10., 9.]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    # A ramp, so that every bin of RoIAlign has its own value.
    features = torch.arange(2 * 8 * 8, dtype=torch.float32).reshape(1, 2, 8, 8)
    rois = torch.tensor([[0., 0., 0., 4., 4.], [0., 2., 2., 7., 6.]])
    pooled = {}
    for where in ['cpu'] + ['cuda'] * torch.cuda.is_available():
        _, keep = nms(boxes.to(where), scores.to(where), iou_threshold=0.5)
        if keep.cpu().tolist() != [3, 2]:
            raise Refused(1, f'nms on {where} kept boxes {keep.cpu().tolist()}, '
                             'expected [3, 2]')
        # output size, spatial scale, sampling ratio, pooling mode, aligned
        pooled[where] = roi_align(features.to(where), rois.to(where), (2, 2), 1.0, 2,
                                  'avg', True).cpu()
        lines.append(f'{where}: nms kept [3, 2]; roi_align {tuple(pooled[where].shape)}'
                     f', sum {pooled[where].sum().item():.4f}')
    # The first RoI covers pixels 0-4 of the ramp: each bin's mean is the value
    # at its centre (aligned: the box starts at pixel centre 0).
    centre = features[0, 0, [1, 3]][:, [1, 3]] - 0.5 * 8 - 0.5
    if not torch.allclose(pooled['cpu'][0, 0], centre, atol=1e-4):
        raise Refused(1, f"roi_align on cpu pooled {pooled['cpu'][0, 0].tolist()}, "
                         f'expected {centre.tolist()}')
    if 'cuda' in pooled and \
            not torch.allclose(pooled['cpu'], pooled['cuda'], atol=1e-4):
        raise Refused(1, 'roi_align differs between cpu and cuda: '
                         f"{(pooled['cpu'] - pooled['cuda']).abs().max().item()}")
    return '\n'.join(lines)


# --- The table of training runs
def parse_run(items: List[str]) -> Dict[str, str]:
    """The ``key=value`` items of one ``--run``; ValueError for an item without
    ``=``, an unknown or repeated key, a required key missing, or a batch that
    is not a positive integer."""
    run: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or key not in RUN_KEYS:
            raise ValueError(f'--run item {item!r}: expected KEY=VALUE with KEY one of '
                             f'{", ".join(RUN_KEYS)}')
        if key in run:
            raise ValueError(f'--run item {item!r}: {key} given twice')
        run[key] = value
    missing = [key for key in RUN_KEYS[:4] if key not in run]
    if missing:
        raise ValueError(f'--run {" ".join(items)}: missing {", ".join(missing)}')
    if not run['batch'].isdigit() or int(run['batch']) < 1:
        raise ValueError(f"--run batch={run['batch']!r}: expected a positive integer")
    return run


def training_entries(work_dir: str) -> List[dict]:
    """The logged training iterations (``iter``, ``time`` and ``loss``) of the
    newest run in ``work_dir``, from mmengine's ``<timestamp>/vis_data/
    scalars.json``; [] when there are none."""
    paths = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    for path in reversed(paths):  # timestamps sort as text: newest first
        with open(path) as file:
            entries = [json.loads(line) for line in file if line.strip()]
        entries = [e for e in entries if {'iter', 'time', 'loss'} <= set(e)]
        if entries:
            return entries
    return []


def timing(entries: List[dict], batch: int, skip: int) -> dict:
    """Seconds per iteration, images per second and peak memory of the
    entries after the first ``skip``: each entry's ``time`` is the mean of
    the iterations since the one before, weighted by their number."""
    marks = [0] + [entry['iter'] for entry in entries]  # marks[i]: before entry i
    iterations = marks[-1] - marks[skip] if len(entries) > skip else 0
    seconds = sum(entry['time'] * (marks[i + 1] - marks[i])
                  for i, entry in enumerate(entries) if i >= skip)
    memory = [entry['memory'] for entry in entries if 'memory' in entry]
    return dict(iterations_logged=marks[-1], iterations_timed=iterations,
                seconds_per_iter=seconds / iterations if iterations else None,
                images_per_s=batch * iterations / seconds if iterations else None,
                peak_memory_mib=max(memory) if iterations and memory else None)


def table_rows(runs: List[Dict[str, str]], skip: int) -> List[dict]:
    """One row per run, with the demo's mAP (its newest evaluation) where a
    run names ``metrics``, and the time against :data:`BASELINE`'s at the
    same batch and size."""
    sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'analysis'))
    from check_metric import newest_metrics  # the evaluation that make demo checks
    rows = []
    for run in runs:
        row = dict(label=run['label'], config=run.get('config'),
                   batch=int(run['batch']), size=run['size'],
                   status=STATUS.get(run.get('status'),
                                     f"failed (exit status {run.get('status')})"))
        row.update(timing(training_entries(run['work_dir']), row['batch'], skip))
        if 'metrics' in run:
            try:
                metrics = newest_metrics(run['metrics'])[1]
            except FileNotFoundError:
                metrics = {}
            row.update({name: metrics.get(name) for name in METRICS})
        rows.append(row)
    baseline = next((row for row in rows if row['label'] == BASELINE
                     and row['seconds_per_iter']), None)
    for row in rows:
        alike = baseline and row['seconds_per_iter'] and all(
            row[key] == baseline[key] for key in ('size', 'batch'))
        row['time_vs_' + BASELINE] = (row['seconds_per_iter'] /
                                      baseline['seconds_per_iter'] if alike else None)
    return rows


def write_table(out: str, runs: List[Dict[str, str]], skip: int, device_line: str,
                notes: List[str]) -> str:
    """Writes ``out/gpu_train.json`` and ``out/gpu_train.md``; returns the
    Markdown."""
    rows = table_rows(runs, skip)
    from mmsoft_analysis.report import table_lines  # tools/analysis/, as table_rows
    write_json(osp.join(out, 'gpu_train.json'),
               dict(device=device_line, skip=skip, runs=rows, notes=notes))
    columns = (('seconds_per_iter', 3), ('images_per_s', 2), ('time_vs_' + BASELINE, 2),
               ('peak_memory_mib', 0), (METRICS[0], 3), (METRICS[1], 3))
    table = table_lines(
        ['run', 'batch', 'image size', 'iterations timed', 's / iteration',
         'images / s', f'time vs {BASELINE}', 'peak GPU memory (MiB)', 'bbox mAP',
         'segm mAP', 'status'],
        [[row['label'], row['batch'], row['size'],
          f"{row['iterations_timed']} of {row['iterations_logged']}",
          *('–' if row.get(key) is None else f'{row[key]:.{digits}f}'
            for key, digits in columns), row['status']] for row in rows])
    text = '\n'.join(['# Training on the GPU node', '', device_line, '', *table, '',
                      *notes]) + '\n'
    with open(osp.join(out, 'gpu_train.md'), 'w') as file:
        file.write(text)
    return text


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    commands.add_parser('device', help="the node's torch and GPU in one line"
                        ).set_defaults(call=lambda args: device())
    node = commands.add_parser('node', help="a training bundle against the node")
    node.add_argument('bundle')
    node.set_defaults(call=lambda args: check_node(args.bundle))
    manifest = commands.add_parser('manifest', help=f"writes the bundle's {MANIFEST}")
    names = ('out', 'key', 'arch_list', 'nvcc', 'built', 'python_version', 'platform')
    for name in names:
        manifest.add_argument(name)
    manifest.set_defaults(call=lambda args: write_manifest(
        *(getattr(args, name) for name in names)))
    ops = commands.add_parser('mmcv-ops', help="checks NMS and RoIAlign of mmcv's ops")
    ops.add_argument('--cuda-version', help='the CUDA release the ops must be '
                     'compiled with, e.g. 13.0')
    ops.add_argument('--require-cuda', action='store_true',
                     help='fail where no GPU is visible')
    ops.set_defaults(call=lambda args: check_mmcv_ops(args.cuda_version,
                                                      args.require_cuda))
    table = commands.add_parser('table', help='writes gpu_train.md and gpu_train.json')
    table.add_argument('--out', required=True, help='folder of gpu_train.md and .json')
    table.add_argument('--run', nargs='+', action='append', required=True,
                       metavar='KEY=VALUE', help='one run: label=, work_dir=, batch=, '
                       'size= and optionally metrics= (a tools/test.py work dir), '
                       'status= (its exit status), config=')
    table.add_argument('--skip', type=int, default=1,
                       help='logged entries left out at the start (default 1)')
    table.add_argument('--device', default='', help='a line naming the device')
    table.add_argument('--note', action='append', default=[],
                       help='a line under the table (repeatable)')
    table.set_defaults(call=lambda args: write_table(
        args.out, args.run, args.skip, args.device, args.note).rstrip('\n'))
    args = parser.parse_args(argv)
    if args.command == 'table':
        if args.skip < 0:
            parser.error(f'--skip {args.skip}: expected 0 or more')
        try:
            args.run = [parse_run(items) for items in args.run]
        except ValueError as error:
            parser.error(str(error))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        print(args.call(args))
    except Refused as error:
        status, message = error.args
        print(message, file=sys.stdout if args.command in ('device', 'node')
              else sys.stderr)
        return status
    except ImportError as error:
        print(f'gpu_node {args.command}: {type(error).__name__}: {error}',
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
