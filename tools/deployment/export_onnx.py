"""Export a config's backbone (optionally with its neck) to ONNX and check it.

The graph has dynamic batch, height and width; the file is checked by onnx and
run in onnxruntime beside PyTorch at each ``--verify-shapes`` size
(docs/deployment.md).
"""
import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict

import torch
import torch.nn as nn
from mmengine.config import Config, DictAction

from mmsoft.apis import build_model_from_config
from mmsoft.checkpoint import compare_state_dict, load_state_dict_safely
from mmsoft.deployment import onnx_export

# The tools' shared code (tools/analysis/mmsoft_analysis).
TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOOLS_DIR, 'analysis'))
from mmsoft_analysis import parse_size, timed  # noqa: E402


class FeatureMaps(nn.Module):
    """A backbone, then optionally a neck, returning a tuple of maps."""

    def __init__(self, backbone: nn.Module, neck: nn.Module = None):
        super().__init__()
        self.backbone = backbone
        self.neck = neck

    def forward(self, images: torch.Tensor):
        feats = self.backbone(images)
        return tuple(self.neck(feats) if self.neck is not None else feats)


def load_feature_weights(model: FeatureMaps, checkpoint: str) -> None:
    """Loads a detector or segmentor checkpoint (its ``backbone.*`` and
    ``neck.*``) or a backbone's own state dict into ``model``; a
    ``ValueError`` lists the weights that are missing or of another shape."""
    state = load_state_dict_safely(checkpoint)
    if not any(key.startswith('backbone.') for key in state):
        state = {f'backbone.{key}': value for key, value in state.items()}
    result = compare_state_dict(state, model.state_dict())
    if not result.fits(allow_unexpected=True):
        raise ValueError(
            f'checkpoint {checkpoint} lacks {len(result.missing)} weights of the '
            f'exported model and has {len(result.mismatched)} in another shape '
            f'({result.describe(allow_unexpected=True)}); expected a checkpoint of '
            f'this config\'s model (or of its backbone alone, exported without the '
            f'neck).')
    model.load_state_dict(result.fitted)


def build_feature_model(cfg: Config, checkpoint: str = None,
                        with_neck: bool = False) -> FeatureMaps:
    """The config's backbone (and neck), with the checkpoint's weights or
    initialised from scratch, in eval mode."""
    full_model = build_model_from_config(cfg)
    neck = getattr(full_model, 'neck', None) if with_neck else None
    if with_neck and neck is None:
        raise ValueError(f'--with-neck but the config {cfg.filename} has no '
                         f'model.neck; export the backbone alone.')
    model = FeatureMaps(full_model.backbone, neck)
    if checkpoint is None:
        for part in (model.backbone, model.neck):
            if part is not None and hasattr(part, 'init_weights'):
                part.init_weights()
    else:
        load_feature_weights(model, checkpoint)
    return model.eval()


def profile_onnxruntime(path: str, images: torch.Tensor, threads: int) -> dict:
    """Seconds of one profiled run per ONNX operator type, largest first."""
    onnx_export.run_onnxruntime(onnx_export.onnxruntime_session(path, threads), images)
    with tempfile.TemporaryDirectory() as out_dir:
        session = onnx_export.onnxruntime_session(
            path, threads, profile_prefix=os.path.join(out_dir, 'ort_profile'))
        onnx_export.run_onnxruntime(session, images)
        with open(session.end_profiling()) as trace:
            events = json.load(trace)
    seconds = defaultdict(float)
    for event in events:
        if event.get('cat') == 'Node' and event['name'].endswith('_kernel_time'):
            seconds[event['args']['op_name']] += event['dur'] * 1e-6
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def parse_args(argv=None) -> argparse.Namespace:
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
    for result in results:
        height, width = result['shape']
        for i, item in enumerate(result['maps']):
            print(f'{height}x{width} out{i} {item["shape"]}: max |diff| '
                  f'{item["max_abs"]:.3g}, output scale {item["scale"]:.3g}, '
                  f'relative {item["relative"]:.3g}')
    largest = max(result['relative'] for result in results)
    passed = largest <= args.tolerance
    print(f'largest difference, relative to the output scale: {largest:.3g} '
          f'(tolerance {args.tolerance:g}): {"OK" if passed else "FAILED"}')
    return passed


def benchmark(model, args) -> None:
    """Times both runtimes (and profiles onnxruntime) at ``--benchmark``."""
    threads = args.threads or torch.get_num_threads()
    height, width = args.benchmark
    images = torch.randn(1, 3, height, width)
    session = onnx_export.onnxruntime_session(args.out, threads)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            torch_seconds = timed(lambda: model(images), args.repeats)[0]
    finally:
        torch.set_num_threads(previous_threads)
    ort_seconds = timed(lambda: onnx_export.run_onnxruntime(session, images),
                        args.repeats)[0]
    print(f'{height}x{width}, {threads} thread(s): PyTorch {torch_seconds:.3f} s, '
          f'onnxruntime {ort_seconds:.3f} s, '
          f'speed-up {torch_seconds / ort_seconds:.2f}x')
    if args.profile:
        seconds = profile_onnxruntime(args.out, images, threads)
        total = sum(seconds.values())
        for op_type, value in list(seconds.items())[:12]:
            print(f'  {op_type:<24} {value:8.3f} s  {100 * value / total:5.1f}%')


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    model = build_feature_model(cfg, args.checkpoint, args.with_neck)
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
