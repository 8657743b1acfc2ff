"""Turns a UFO-ViT image-classifier checkpoint into a backbone checkpoint
(docs/pretraining.md). SRC (path or URL) is a checkpoint of
``configs/ufo_vit/pretrain``; only the resampling branches of outputs 0 and 1,
untrained by classification, may be missing.
"""
import argparse
import os
import os.path as osp
import re
import sys
from typing import List, Mapping, Optional, Tuple

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmsoft.checkpoint import (  # noqa: E402
    fit_state_dict, key_list, load_checkpoint_file, split_prefix, unwrap_state_dict)
from mmsoft.checkpoint.loading import UFO_VIT_OPTIONAL_KEY  # noqa: E402
from mmsoft.models.ufo_vit import ARCH_DEFAULTS, ARCH_SETTINGS, NUM_STAGES  # noqa: E402
from mmsoft.openmmlab import UFOViT  # noqa: E402
from mmsoft.version import __version__  # noqa: E402

#: Prefix of the backbone's tensors in a classifier (or detector) checkpoint.
BACKBONE_PREFIX = 'backbone.'
#: Keys read to recognise the architecture.
ARCH_KEYS = ('patch_embed.proj.0.weight', 'pos_embed.proj.weight',
             'blocks.0.norm1.weight', 'blocks.0.attn.gamma_q',
             'blocks.0.mlp.fc1.weight', 'blocks.0.lpi.conv1.weight')
_BLOCK = re.compile(r'blocks\.(\d+)\.')


def _key_pattern(key: str) -> str:
    """The key with its block index as ``N``."""
    return _BLOCK.sub('blocks.N.', key, count=1)


def select_backbone_tensors(state_dict: Mapping, prefix: str = BACKBONE_PREFIX
                            ) -> Tuple[dict, List[str]]:
    """The backbone tensors under ``prefix`` (``module.`` ignored), prefix
    removed, and the dropped keys: the other keys and the non-tensor entries;
    a ``ValueError`` when there are none."""
    selected, others = split_prefix(state_dict, prefix)
    backbone = {k: v for k, v in selected.items() if isinstance(v, torch.Tensor)}
    if not backbone:
        raise ValueError(
            f'the checkpoint has no tensors under {prefix!r}; expected an image '
            f'classifier checkpoint with the backbone under {prefix!r} and the '
            f'head under "head." (its keys: {key_list(state_dict, 20)}).')
    skipped = [f'{prefix}{key}' for key in selected if key not in backbone]
    return backbone, sorted(others + skipped)


def detect_ufo_vit_settings(state_dict: Mapping) -> dict:
    """The ``arch``, ``in_channels`` and ``qkv_bias`` of ``UFOViT`` backbone
    tensors, read off their shapes; a ``ValueError`` lists what is missing
    and unexpected."""
    missing = [key for key in ARCH_KEYS if key not in state_dict]
    if missing:  # the keys no four-output UFOViT has
        model = UFOViT(arch=dict(embed_dims=16, depth=4, num_heads=2))
        patterns = {_key_pattern(key) for key in model.state_dict()}
        unexpected = [k for k in state_dict if _key_pattern(k) not in patterns]
        raise ValueError(
            f'not a UFO-ViT backbone: missing keys: {key_list(missing)}; '
            f'unexpected keys: {key_list(unexpected)}.')
    dims = int(state_dict['blocks.0.norm1.weight'].shape[0])
    indices = sorted({int(m.group(1)) for m in map(_BLOCK.match, state_dict) if m})
    if indices != list(range(len(indices))):
        raise ValueError(f'block indices {indices} are not consecutive from 0.')
    mlp_ratio = state_dict['blocks.0.mlp.fc1.weight'].shape[0] / dims
    arch = dict(
        embed_dims=dims,
        depth=len(indices),
        num_heads=int(state_dict['blocks.0.attn.gamma_q'].shape[0]),
        mlp_ratio=int(mlp_ratio) if float(mlp_ratio).is_integer() else mlp_ratio,
        local_kernel_size=int(state_dict['blocks.0.lpi.conv1.weight'].shape[-1]),
        pos_hidden_dims=int(state_dict['pos_embed.proj.weight'].shape[1]) // 2)
    return dict(arch=arch,
                in_channels=int(state_dict['patch_embed.proj.0.weight'].shape[1]),
                qkv_bias='blocks.0.attn.qkv.bias' in state_dict)


def match_ufo_vit_arch(arch: Mapping) -> Optional[str]:
    """The name in ``ARCH_SETTINGS`` of ``arch``, or None."""
    for name, settings in ARCH_SETTINGS.items():
        full = dict(ARCH_DEFAULTS, **settings)
        if all(arch.get(key) == value for key, value in full.items()):
            return name
    return None


def check_ufo_vit_state_dict(state_dict: Mapping, settings: Mapping) -> List[str]:
    """Checks the tensors against a four-output ``UFOViT`` of ``settings``;
    returns the missing resampling-branch keys, a ``ValueError`` lists any
    other difference."""
    model = UFOViT(arch=dict(settings['arch']), in_channels=settings['in_channels'],
                   qkv_bias=settings['qkv_bias'], out_indices=tuple(range(NUM_STAGES)))
    return fit_state_dict(
        state_dict, model.state_dict(), optional=UFO_VIT_OPTIONAL_KEY,
        context=f'the backbone tensors do not match UFOViT(arch='
        f'{dict(settings["arch"])}, in_channels={settings["in_channels"]}, '
        f'qkv_bias={settings["qkv_bias"]})').optional_missing


def ufo_vit_cls_to_backbone(checkpoint: Mapping) -> Tuple[dict, dict]:
    """The backbone state dict of a classifier checkpoint and what was found:
    ``arch`` (or None), ``arch_settings``, ``in_channels``, ``qkv_bias``,
    ``num_tensors``, ``dropped``, ``not_pretrained``, ``wrapper``, ``ema``
    and, from ``meta``, ``epoch`` and ``iter``."""
    state_dict, wrapper = unwrap_state_dict(checkpoint)
    backbone, dropped = select_backbone_tensors(state_dict)
    settings = detect_ufo_vit_settings(backbone)
    not_pretrained = check_ufo_vit_state_dict(backbone, settings)
    info = dict(arch=match_ufo_vit_arch(settings['arch']),
                arch_settings=dict(settings['arch']),
                in_channels=settings['in_channels'], qkv_bias=settings['qkv_bias'],
                num_tensors=len(backbone), dropped=dropped,
                not_pretrained=not_pretrained, wrapper=wrapper,
                ema=wrapper is not None and 'ema_state_dict' in checkpoint)
    meta = checkpoint.get('meta') if wrapper else None
    if isinstance(meta, Mapping):
        for key in ('epoch', 'iter'):
            if isinstance(meta.get(key), int):
                info[key] = meta[key]
    return backbone, info


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Extract the UFOViT backbone of an image-classifier '
        'checkpoint.')
    parser.add_argument('src', help='classifier checkpoint (path or URL)')
    parser.add_argument('dst', help='output backbone checkpoint')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the conversion; returns the exit status (1 on a foreign checkpoint)."""
    args = parse_args(argv)
    checkpoint = load_checkpoint_file(args.src, map_location='cpu')
    try:
        state_dict, info = ufo_vit_cls_to_backbone(checkpoint)
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
          f'dropped (keys outside {BACKBONE_PREFIX!r})')
    print(f'not pretrained:  {len(info["not_pretrained"])} tensors of the stride '
          f'4/8 output branches (initialised by the dense model)')

    meta = {key: info[key] for key in (
        'arch', 'arch_settings', 'in_channels', 'qkv_bias', 'not_pretrained')}
    meta.update(num_dropped=len(info['dropped']), ema=info['ema'])
    meta.update((f'source_{k}', info[k]) for k in ('epoch', 'iter') if k in info)
    meta.update(converter='tools/model_converters/ufo_vit_cls2backbone.py',
                mmsoft_version=__version__, source=osp.basename(args.src))
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    torch.save(dict(state_dict={key: value.detach().clone().contiguous()
                                for key, value in state_dict.items()}, meta=meta),
               args.dst)
    print(f'saved:           {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
