"""Export a config's backbone (optionally with its neck) to ONNX and check it.

The graph has dynamic batch, height and width. After export the file is
checked by onnx's checker and run in onnxruntime next to PyTorch at each
``--verify-shapes`` size; the largest difference is printed and the command
fails when it exceeds ``--tolerance`` (relative to the output scale).

Example::

    python tools/deployment/export_onnx.py \
        configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py CHECKPOINT \
        --out work_dirs/soft++-tiny.onnx --verify-shapes 224x224 800x1333 333x517
    python tools/deployment/export_onnx.py CONFIG --out backbone_fpn.onnx \
        --with-neck --benchmark 800x1333 --threads 1

Without a checkpoint the backbone (and neck) are initialised from scratch,
which is enough to try the export.
"""
import argparse
import sys

from mmengine.config import Config, DictAction

from mmsoft.utils.sizes import parse_size
from mmsoft.deployment import onnx_export


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('checkpoint', nargs='?',
                        help='detector, segmentor or backbone checkpoint '
                        '(default: weights initialised from scratch)')
    parser.add_argument('--out', required=True, help='the .onnx file to write')
    parser.add_argument('--with-neck', action='store_true',
                        help="export the config's neck after the backbone")
    parser.add_argument('--shape', type=parse_size, default=(224, 224),
                        help='HxW of the image the graph is traced on '
                        '(the graph takes any size)')
    parser.add_argument('--verify-shapes', type=parse_size, nargs='*',
                        default=[(224, 224), (333, 517)],
                        help='HxW sizes run in onnxruntime and PyTorch '
                        '(the flag alone, without sizes, skips the comparison)')
    parser.add_argument('--tolerance', type=float, default=1e-4,
                        help='largest accepted difference, relative to the '
                        'largest absolute output value of each map')
    parser.add_argument('--threads', type=int,
                        help='threads of PyTorch and onnxruntime '
                        '(default: their own defaults)')
    parser.add_argument('--benchmark', type=parse_size, metavar='HxW',
                        help='also time one forward in both at this size')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed calls of --benchmark (after one untimed)')
    parser.add_argument('--profile', action='store_true',
                        help="with --benchmark: onnxruntime's time per operator type")
    parser.add_argument('--opset', type=int, default=onnx_export.DEFAULT_OPSET)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config; lists as key="[a,b]"')
    return parser.parse_args(argv)


def verify(model, args) -> bool:
    """Runs the comparison; prints it; True when within the tolerance."""
    session = onnx_export.onnxruntime_session(args.out, args.threads)
    results = onnx_export.verify_onnx(model, session, args.verify_shapes)
    for line in onnx_export.describe_verification(results):
        print(line)
    largest = onnx_export.largest_relative(results)
    passed = largest <= args.tolerance
    print(f'largest difference, relative to the output scale: {largest:.3g} '
          f'(tolerance {args.tolerance:g}): {"OK" if passed else "FAILED"}')
    return passed


def benchmark(model, args) -> None:
    """Times both runtimes (and profiles onnxruntime) at ``--benchmark``."""
    import torch
    threads = args.threads or torch.get_num_threads()
    speed = onnx_export.compare_speed(model, args.out, args.benchmark, threads,
                                      repeats=args.repeats)
    height, width = args.benchmark
    print(f'{height}x{width}, {threads} thread(s): PyTorch '
          f'{speed["torch_seconds"]:.3f} s, onnxruntime '
          f'{speed["onnxruntime_seconds"]:.3f} s, speed-up {speed["speedup"]:.2f}x')
    if args.profile:
        images = torch.randn(1, 3, height, width)
        seconds = onnx_export.profile_onnxruntime(args.out, images, threads)
        total = sum(seconds.values())
        for op_type, value in list(seconds.items())[:12]:
            print(f'  {op_type:<24} {value:8.3f} s  {100 * value / total:5.1f}%')


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    model = onnx_export.build_feature_model(cfg, args.checkpoint, args.with_neck)
    names = onnx_export.export_onnx(model, args.out, args.shape, args.opset)
    onnx_export.check_onnx_file(args.out)
    print(f'exported {args.out}: input {onnx_export.INPUT_NAME} (batch, 3, height, '
          f'width), outputs {", ".join(names)}; onnx checker: OK')
    passed = verify(model, args) if args.verify_shapes else True
    if args.benchmark:
        benchmark(model, args)
    return 0 if passed else 1


if __name__ == '__main__':
    sys.exit(main())
