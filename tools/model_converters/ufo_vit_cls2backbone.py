"""Turns a UFO-ViT image-classifier checkpoint into a backbone checkpoint.

Usage::

    python tools/model_converters/ufo_vit_cls2backbone.py SRC DST

SRC is a checkpoint of the mmpretrain pre-training
(``configs/ufo_vit/pretrain``: an mmpretrain ``ImageClassifier``, mmengine
format, ``state_dict`` with the backbone under ``backbone.`` and the head
under ``head.``; with ``EMAHook`` the ``state_dict`` holds the EMA weights),
a path or URL. DST receives ``{'state_dict': ..., 'meta': ...}`` with the
backbone tensors in ``UFOViT``'s key layout, loadable in the detection and
segmentation configs with ``init_cfg=dict(type='Pretrained',
checkpoint=DST)``. The architecture is read from the tensor shapes and every
key is checked against a ``UFOViT`` of it; the head is dropped. The
resampling branches of outputs 0 and 1 (strides 4 and 8) are not trained by
classification and are not in DST: the dense-prediction model starts them
from their initial values.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmsoft.checkpoint import load_checkpoint_file  # noqa: E402
from mmsoft.pretrain.cls_to_backbone import (  # noqa: E402
    backbone_checkpoint, ufo_vit_cls_to_backbone)
from mmsoft.version import __version__  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Extract the UFOViT backbone of an image-classifier '
        'checkpoint.')
    parser.add_argument('src', help='classifier checkpoint (path or URL)')
    parser.add_argument('dst', help='output backbone checkpoint')
    parser.add_argument('--prefix', default='backbone.',
                        help='prefix of the backbone keys (default: backbone.)')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the conversion; returns the exit status (1 on a foreign checkpoint)."""
    args = parse_args(argv)
    checkpoint = load_checkpoint_file(args.src, map_location='cpu')
    try:
        state_dict, info = ufo_vit_cls_to_backbone(checkpoint, prefix=args.prefix)
    except ValueError as exc:
        print(f'error: {args.src}: {exc}', file=sys.stderr)
        return 1
    settings = info['arch_settings']
    arch = info['arch'] or 'custom (not in the UFOViT arch table)'
    print(f'source:          {args.src}')
    if 'epoch' in info or 'iter' in info:
        print(f'trained:         epoch {info.get("epoch", "-")}, iteration '
              f'{info.get("iter", "-")}')
    print(f'arch:            {arch}: ' +
          ', '.join(f'{k}={v}' for k, v in settings.items()))
    weights = ('EMA (the EMAHook average)' if info['ema'] else
               'as trained (no ema_state_dict)')
    print(f'weights:         {weights}')
    print(f'tensors:         {info["num_tensors"]} kept, {len(info["dropped"])} '
          f'dropped (keys outside {args.prefix!r})')
    print(f'not pretrained:  {len(info["not_pretrained"])} tensors of the stride '
          f'4/8 output branches (initialised by the dense model)')
    result = backbone_checkpoint(
        state_dict, info, converter='tools/model_converters/ufo_vit_cls2backbone.py',
        mmsoft_version=__version__, source=osp.basename(args.src))
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    torch.save(result, args.dst)
    print(f'saved:           {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
