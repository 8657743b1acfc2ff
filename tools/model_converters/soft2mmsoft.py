"""Converts a reference SOFT / SOFT++ ImageNet checkpoint to mmsoft's layout
(docs/training.md). The variant comes from ``--variant``, else the
checkpoint's metadata, else SRC's file name (``norm`` in it: SOFT++); the
architecture from the shapes.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, List, Optional

import torch

from mmsoft.checkpoint import load_checkpoint_file, soft_official_to_mmsoft
from mmsoft.checkpoint.soft_official import NUM_STAGES, check_detected_arch
from mmsoft.models.soft import ARCH_DEFAULTS, ARCH_SETTINGS
from mmsoft.openmmlab import SOFT
from mmsoft.version import __version__


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert a reference SOFT/SOFT++ checkpoint to mmsoft.')
    parser.add_argument('src', help='reference checkpoint (path or URL)')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--variant', choices=['soft', 'soft++'], default=None,
                        help='attention variant the weights were trained with: '
                        'soft (SOFT) or soft++ (the "norm" models); needed when '
                        'neither the checkpoint nor its file name tells')
    return parser.parse_args(argv)


def soft_state_layout(settings: dict) -> Dict[str, torch.Tensor]:
    """``SOFT(...).state_dict()`` as tensors on the meta device (keys and
    shapes) of the ``settings`` that
    :func:`~mmsoft.checkpoint.soft_official.detect_soft_settings` returns."""
    last = NUM_STAGES - 1
    # The last stage's head count and bottleneck stride are in no tensor
    # shape; any valid value gives the same layout.
    arch = dict(embed_dims=settings['embed_dims'], depths=settings['depths'],
                num_heads=list(settings['num_heads'][:last]) + [1],
                sr_ratios=list(settings['sr_ratios'][:last]) + [1],
                local_kernel_sizes=settings['local_kernel_sizes'],
                mlp_ratios=settings['mlp_ratios'],
                stem_channels=settings['stem_channels'])
    model = SOFT(arch=arch, in_channels=settings['in_channels'],
                 pretrain_img_size=settings['pretrain_img_size'] or 224)
    return {key: torch.empty(value.shape, device='meta')
            for key, value in model.state_dict().items()}


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the conversion; returns the exit status."""
    args = parse_args(argv)
    checkpoint = load_checkpoint_file(args.src, map_location='cpu')
    try:
        state_dict, info = soft_official_to_mmsoft(
            checkpoint, variant=args.variant, name_hint=osp.basename(args.src),
            arch_table=ARCH_SETTINGS, arch_defaults=ARCH_DEFAULTS)
        settings = info['arch_settings']
        check_detected_arch(state_dict, settings, soft_state_layout(settings))
    except ValueError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    if info['variant'] is None:
        print('error: the attention variant cannot be told from the weights (SOFT '
              'and SOFT++ have the same parameters), the checkpoint metadata or '
              'the file name; pass --variant soft or --variant soft++.',
              file=sys.stderr)
        return 1

    print(f'source:      {args.src}')
    if info['wrapper'] or info['stripped_prefixes']:
        print(f'unwrapped:   {info["wrapper"] or "-"}; prefixes removed: '
              f'{", ".join(info["stripped_prefixes"]) or "-"}')
    fields = ', '.join(f'{k}={settings[k]}' for k in (
        'embed_dims', 'num_heads', 'depths', 'sr_ratios', 'local_kernel_sizes'))
    print(f'arch:        {info["arch"] or "not in the SOFT arch table"} ({fields})')
    print(f'variant:     {info["variant"]} (from {info["variant_source"]})')
    detected = info['variant_detected']
    if detected is not None and detected != info['variant']:
        print(f'warning:     the checkpoint points to variant={detected!r}; '
              f'--variant {info["variant"]} overrides it', file=sys.stderr)
    print(f'image size:  {info["pretrain_img_size"]} (position embeddings)')
    print(f'tensors:     {info["num_tensors"]} converted; dropped: '
          f'{", ".join(info["dropped"]) or "-"}')

    meta = dict(converter='tools/model_converters/soft2mmsoft.py',
                mmsoft_version=__version__, source=osp.basename(args.src),
                arch_settings=dict(settings), **{key: info[key] for key in (
                    'arch', 'variant', 'variant_source', 'pretrain_img_size',
                    'dropped')})
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    torch.save(dict(state_dict={key: value.detach().clone().contiguous()
                                for key, value in state_dict.items()}, meta=meta),
               args.dst)
    print(f'saved:       {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
