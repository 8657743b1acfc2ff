"""Parameters and FLOPs of a config's model, or of its backbone alone.

FLOPs are multiply-adds counted by mmengine's FlopAnalyzer plus handles for
what it misses (Gaussian kernel, SOFT's inverse, XNorm, element-wise work,
fused softmax attention): see ``mmsoft/models/flop_handles.py``. Needs no
dataset and no checkpoint.

Example::

    python tools/analysis/get_flops.py configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py \
        --shape 800 1333
    python tools/analysis/get_flops.py CONFIG --backbone-only --shape 224 224
"""
import argparse
import json

import torch
from mmengine.config import Config

from mmsoft.analysis import count_flops
from mmsoft.apis import add_cfg_options
from mmsoft.analysis.config_models import (DEFAULT_SHAPES, TensorModeModel,
                                          build_model_from_config, config_scope)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='config file')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size (default: 800 1333 for mmdet, '
                        '512 512 for mmseg configs)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='count the backbone alone')
    parser.add_argument('--mmengine-only', action='store_true',
                        help="mmengine's plain count, without mmsoft's handles")
    parser.add_argument('--json', help='also write the figures to this JSON file')
    add_cfg_options(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    scope = config_scope(cfg)
    shape = tuple(args.shape or DEFAULT_SHAPES[scope])
    model = build_model_from_config(cfg)
    target = model.backbone if args.backbone_only else TensorModeModel(
        model, scope, shape)
    images = torch.randn(1, 3, *shape)
    with torch.no_grad():
        flops, analyzer = count_flops(target, (images, ),
                                      with_extra_handles=not args.mmengine_only)
    params = sum(p.numel() for p in target.parameters())
    result = dict(config=args.config, shape=list(shape),
                  part='backbone' if args.backbone_only else 'model',
                  params_m=round(params / 1e6, 3), gflops=round(flops / 1e9, 3),
                  uncounted_ops=dict(analyzer.unsupported_ops()))
    print(f"{'=' * 60}\nConfig: {args.config}\nInput shape: {shape}\n"
          f"Part: {result['part']}\nParams: {result['params_m']:.2f} M\n"
          f"FLOPs: {result['gflops']:.2f} G (multiply-adds)\n"
          f"Not counted: {result['uncounted_ops'] or 'none'}\n{'=' * 60}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(result, file, indent=2)


if __name__ == '__main__':
    main()
