"""Parameters and FLOPs of a config's model, or of its backbone alone.

FLOPs are multiply-adds: mmengine's FlopAnalyzer plus mmsoft's handles
(``mmsoft_analysis/flop_handles.py``), on seeded weights and input, with the
RPN's proposals kept so that the count does not depend on the weights
(docs/benchmarks.md).
"""
import argparse
import copy
import json
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config, DictAction

from mmsoft.apis import build_model_from_config
from mmsoft_analysis.flop_handles import count_flops

SEED = 0
DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512)}


class TensorModeModel(nn.Module):
    """An mmdet detector or mmseg segmentor (``scope``) whose
    ``forward(images)`` runs the network end to end (backbone, neck, heads)
    without post-processing, on inputs of ``shape`` (H, W)."""

    def __init__(self, model: nn.Module, scope: str, shape: Tuple[int, int]):
        super().__init__()
        self.model = model
        self.data_samples = None
        if scope == 'mmdet':
            from mmdet.structures import DetDataSample
            meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                        batch_input_shape=shape, scale_factor=(1., 1.))
            self.data_samples = [DetDataSample(metainfo=meta)]

    def forward(self, images: torch.Tensor):
        """Raw head outputs for ``images`` (1, 3, H, W)."""
        return self.model._forward(images, self.data_samples)


def keep_all_proposals(cfg: Config) -> Config:
    """A copy of ``cfg`` whose RPN, if any, removes no proposal at test time:
    the size filter and NMS over random weights keep a number of boxes that
    changes with the seed; without them the RoI head always gets the RPN's
    ``max_per_img`` proposals."""
    cfg = copy.deepcopy(cfg)
    rpn = (cfg.model.get('test_cfg') or {}).get('rpn')
    if rpn is not None:
        rpn.min_bbox_size = -1  # no size filter
        if rpn.get('nms') is not None:
            rpn.nms.iou_threshold = 1.0  # suppresses a box only when IoU > 1
    return cfg


def count_config(cfg: Config, shape: Optional[Sequence[int]] = None,
                 backbone_only: bool = False) -> dict:
    """The ``params``, ``backbone_params``, ``flops`` (multiply-adds) and
    ``uncounted_ops`` (operator -> calls left out) of the model an mmdet or
    mmseg config builds, in tensor mode (or with ``backbone_only`` its
    backbone: ``part``), at input ``shape`` (H, W; by default
    :data:`DEFAULT_SHAPES`)."""
    scope = cfg.get('default_scope', None)
    if scope not in DEFAULT_SHAPES:
        raise ValueError(f'default_scope={scope!r} of the config is not supported; '
                         f'expected one of {list(DEFAULT_SHAPES)}.')
    shape = tuple(shape or DEFAULT_SHAPES[scope])
    torch.manual_seed(SEED)
    model = build_model_from_config(keep_all_proposals(cfg))
    target = model.backbone if backbone_only else TensorModeModel(
        model, scope, shape)
    with torch.no_grad():
        flops, analyzer = count_flops(target, (torch.randn(1, 3, *shape), ))
    return dict(shape=list(shape), part='backbone' if backbone_only else 'model',
                params=sum(p.numel() for p in target.parameters()),
                backbone_params=sum(p.numel() for p in model.backbone.parameters()),
                flops=int(flops), uncounted_ops=dict(analyzer.unsupported_ops()))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='config file')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size (default: 800 1333 for mmdet, '
                        '512 512 for mmseg configs)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='count the backbone alone')
    parser.add_argument('--json', help='also write the figures to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config; lists as key="[a,b]"')
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    counted = count_config(cfg, args.shape, backbone_only=args.backbone_only)
    result = dict(config=args.config, shape=counted['shape'], part=counted['part'],
                  params_m=round(counted['params'] / 1e6, 3),
                  gflops=round(counted['flops'] / 1e9, 3),
                  uncounted_ops=counted['uncounted_ops'])
    print(f"{'=' * 60}\nConfig: {args.config}\nInput shape: {tuple(result['shape'])}\n"
          f"Part: {result['part']}\nParams: {result['params_m']:.2f} M\n"
          f"FLOPs: {result['gflops']:.2f} G (multiply-adds)\n"
          f"Not counted: {result['uncounted_ops'] or 'none'}\n{'=' * 60}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(result, file, indent=2)


if __name__ == '__main__':
    main()
