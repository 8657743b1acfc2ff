"""Converts a reference SOFT / SOFT++ ImageNet checkpoint to mmsoft's layout.

Usage::

    python tools/model_converters/soft2mmsoft.py SRC DST [--attention soft|soft++]

SRC is a checkpoint of the reference implementation (fudan-zvg/SOFT): a bare
state dict or a dict holding it under ``state_dict``/``model``, keys possibly
prefixed with ``module.`` or ``backbone.``. DST receives
``{'state_dict': ..., 'meta': ...}`` (torch.save), loadable with
``init_cfg=dict(type='Pretrained', checkpoint=DST)`` in a ``SOFT`` backbone.

The plain SOFT and the SOFT++ ("norm") models have identical parameters; the
variant is read from ``--attention``, else from the checkpoint's metadata
(timm's ``arch``/``args.model``), else from SRC's file name (``norm`` in it
means SOFT++). When none of these decides, the converter stops and asks for
``--attention``.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

import torch

from mmsoft.checkpoint import load_checkpoint_file, soft_official_to_mmsoft
from mmsoft.version import __version__


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert a reference SOFT/SOFT++ checkpoint to mmsoft.')
    parser.add_argument('src', help='reference checkpoint (path or URL)')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--attention', choices=['soft', 'soft++'], default=None,
                        help='attention variant the weights were trained with: '
                        'soft (SOFT) or soft++ (the "norm" models); needed when '
                        'neither the checkpoint nor its file name tells')
    return parser.parse_args(argv)


def describe_arch(info: dict) -> str:
    """One line: the arch name, or the detected settings of an unnamed one."""
    settings = info['arch_settings']
    fields = ', '.join(f'{k}={settings[k]}' for k in (
        'embed_dims', 'num_heads', 'depths', 'sr_ratios', 'local_kernel_sizes'))
    if info['arch'] is None:
        return f'not in the SOFT arch table ({fields})'
    return f'{info["arch"]} ({fields})'


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the conversion; returns the exit status."""
    args = parse_args(argv)
    checkpoint = load_checkpoint_file(args.src, map_location='cpu')
    try:
        state_dict, info = soft_official_to_mmsoft(
            checkpoint, attention=args.attention, name_hint=osp.basename(args.src))
    except ValueError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    if info['attention'] is None:
        print('error: the attention variant cannot be told from the weights (SOFT '
              'and SOFT++ have the same parameters), the checkpoint metadata or '
              'the file name; pass --attention soft or --attention soft++.',
              file=sys.stderr)
        return 1

    print(f'source:      {args.src}')
    if info['wrapper'] or info['stripped_prefixes']:
        print(f'unwrapped:   {info["wrapper"] or "-"}; prefixes removed: '
              f'{", ".join(info["stripped_prefixes"]) or "-"}')
    print(f'arch:        {describe_arch(info)}')
    print(f'attention:   {info["attention"]} (from {info["attention_source"]})')
    detected = info['attention_detected']
    if detected is not None and detected != info['attention']:
        print(f'warning:     the checkpoint points to attention={detected!r}; '
              f'--attention {info["attention"]} overrides it', file=sys.stderr)
    print(f'image size:  {info["pretrain_img_size"]} (position embeddings)')
    print(f'tensors:     {info["num_tensors"]} converted; dropped: '
          f'{", ".join(info["dropped"]) or "-"}')

    settings = info['arch_settings']
    meta = dict(
        converter='tools/model_converters/soft2mmsoft.py',
        mmsoft_version=__version__,
        source=osp.basename(args.src),
        arch=info['arch'],
        arch_settings={k: v for k, v in settings.items()},
        attention=info['attention'],
        attention_source=info['attention_source'],
        pretrain_img_size=info['pretrain_img_size'],
        dropped=info['dropped'])
    state_dict = {key: value.detach().clone().contiguous()
                  for key, value in state_dict.items()}
    out_dir = osp.dirname(osp.abspath(args.dst))
    os.makedirs(out_dir, exist_ok=True)
    torch.save({'state_dict': state_dict, 'meta': meta}, args.dst)
    print(f'saved:       {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
