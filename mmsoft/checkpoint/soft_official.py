"""Official SOFT / SOFT++ checkpoints (fudan-zvg/SOFT) in mmsoft's key layout.

The renaming is a table of rules. No tensor tells SOFT from SOFT++: the
variant comes from the argument, the checkpoint's metadata or the file name.
"""
import math
import os.path as osp
import re
from typing import List, Mapping, Optional, Tuple

import torch

from .strict import (WRAPPER_PREFIXES, StateDict, fit_state_dict, key_list,
                     unwrap_state_dict)

#: Stages of the reference layout (``patch_embed1``..``4``, ``block1``..``4``).
NUM_STAGES = 4
#: Reference keys that have no counterpart in the backbone.
DROPPED_KEY = re.compile(r'head\..+')
#: Attention variants of the reference checkpoints: SOFT and SOFT++ ("norm").
OFFICIAL_VARIANTS = ('soft', 'soft++')

_BN_PARAM = r'(?P<param>weight|bias|running_mean|running_var|num_batches_tracked)'
_AFFINE_PARAM = r'(?P<param>weight|bias)'
_SOFT_BLOCK = r'block(?P<stage>[123])\.(?P<block>0|[1-9]\d*)\.att\.'
_SOFT_TARGET = 'stages.{stage}.blocks.{block}.'

# (pattern over a whole reference key, template of the mmsoft key). Named group
# ``stage`` is 1-based in the reference and 0-based in mmsoft.
KEY_RULES: List[Tuple[re.Pattern, str]] = [
    (rf'patch_embed(?P<stage>1)\.proj\.(?P<layer>[013467])\.{_BN_PARAM}',
     'stages.{stage}.patch_embed.proj.{layer}.{param}'),
    (rf'patch_embed(?P<stage>[234])\.proj\.(?P<layer>[01])\.{_BN_PARAM}',
     'stages.{stage}.patch_embed.proj.{layer}.{param}'),
    (r'pos_embed(?P<stage>[1-4])', 'stages.{stage}.pos_embed'),
    (r'cls_token', f'stages.{NUM_STAGES - 1}.cls_token'),
    (rf'{_SOFT_BLOCK}mha\.W_q\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.q_proj.{param}'),
    (rf'{_SOFT_BLOCK}mha\.W_v\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.v_proj.{param}'),
    (rf'{_SOFT_BLOCK}mha\.attn\.Qlandmark_op\.weight',
     _SOFT_TARGET + 'attn.bottleneck_conv.weight'),
    (rf'{_SOFT_BLOCK}mha\.attn\.Qnorm_act\.0\.{_AFFINE_PARAM}',
     _SOFT_TARGET + 'attn.bottleneck_norm.{param}'),
    (rf'{_SOFT_BLOCK}mha\.attn\.conv\.weight', _SOFT_TARGET + 'attn.local_conv.weight'),
    (rf'{_SOFT_BLOCK}mha\.ff\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.out_proj.{param}'),
    (rf'{_SOFT_BLOCK}norm1\.{_AFFINE_PARAM}', _SOFT_TARGET + 'norm1.{param}'),
    (rf'{_SOFT_BLOCK}ff1\.{_AFFINE_PARAM}', _SOFT_TARGET + 'mlp.fc1.{param}'),
    (rf'{_SOFT_BLOCK}ff2\.{_AFFINE_PARAM}', _SOFT_TARGET + 'mlp.fc2.{param}'),
    (rf'{_SOFT_BLOCK}norm2\.{_AFFINE_PARAM}', _SOFT_TARGET + 'norm2.{param}'),
    (r'block(?P<stage>4)\.(?P<block>0|[1-9]\d*)\.'
     r'(?P<name>norm1|attn\.q|attn\.kv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.'
     + _AFFINE_PARAM, 'stages.{stage}.blocks.{block}.{name}.{param}'),
    (rf'norm\.{_AFFINE_PARAM}', f'stages.{NUM_STAGES - 1}.norm.{{param}}'),
]
KEY_RULES = [(re.compile(pattern), template) for pattern, template in KEY_RULES]

_SIZES = r'(tiny|small|medium|large|huge)'


def rename_official_key(key: str) -> Optional[str]:
    """The mmsoft key of an official key (``'block1.0.att.mha.W_q.weight'`` ->
    ``'stages.0.blocks.0.attn.q_proj.weight'``), or None."""
    for pattern, template in KEY_RULES:
        match = pattern.fullmatch(key)
        if match:
            fields = match.groupdict()
            if 'stage' in fields:
                fields['stage'] = int(fields['stage']) - 1
            return template.format(**fields)
    return None


def variant_hint(text: Optional[str]) -> Optional[str]:
    """``'soft++'`` for a model or file name with ``norm``, ``'soft'`` for
    another official name (``soft_tiny``), else None."""
    if not isinstance(text, str):
        return None
    text = text.lower()
    if 'norm' in text:
        return 'soft++'
    if re.search(rf'soft[_-]?{_SIZES}', text) or 'softmaxfreevisiontransformer' in text:
        return 'soft'
    return None


def _metadata_model_names(checkpoint: Mapping) -> List[str]:
    """Model names a timm training checkpoint stores (``arch``, ``args.model``)."""
    names = []
    if isinstance(checkpoint.get('arch'), str):
        names.append(checkpoint['arch'])
    args = checkpoint.get('args')
    model = (args.get('model') if isinstance(args, Mapping)
             else getattr(args, 'model', None))
    if isinstance(model, str):
        names.append(model)
    return names


def resolve_variant(checkpoint: Mapping, variant: Optional[str] = None,
                    name_hint: Optional[str] = None
                    ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """``(variant, source, detected)`` of an official checkpoint: the argument
    wins over the metadata (timm's ``arch``, ``args.model``), which wins over
    the file name; ``detected`` is what the file itself points to.

    Raises:
        ValueError: ``variant`` is not one of :data:`OFFICIAL_VARIANTS`.
    """
    if variant is not None and variant not in OFFICIAL_VARIANTS:
        raise ValueError(f'variant={variant!r} is not supported; expected one '
                         f'of {list(OFFICIAL_VARIANTS)}.')
    detected, source = None, None
    meta_hints = {variant_hint(name) for name in _metadata_model_names(checkpoint)}
    meta_hints.discard(None)
    if len(meta_hints) == 1:
        detected, source = meta_hints.pop(), 'checkpoint metadata'
    elif variant_hint(osp.basename(name_hint or '')) is not None:
        detected, source = variant_hint(osp.basename(name_hint)), 'file name'
    if variant is not None:
        return variant, 'argument', detected
    return detected, source, detected


def _tensor_shape(state_dict: Mapping, key: str) -> torch.Size:
    return state_dict[key].shape


def detect_soft_settings(state_dict: Mapping) -> dict:
    """The architecture of a state dict in mmsoft's layout, read off its shapes:
    ``embed_dims``, ``num_heads`` (the last stage's is in no shape: None),
    ``depths``, ``sr_ratios``, ``local_kernel_sizes``, ``mlp_ratios``,
    ``stem_channels``, ``in_channels`` and ``pretrain_img_size``.

    Raises:
        ValueError: Missing tensors, or inconsistent shapes.
    """
    required = [f'stages.0.patch_embed.proj.{layer}.weight' for layer in (0, 6)]
    required += [f'stages.{i}.patch_embed.proj.0.weight' for i in range(1, NUM_STAGES)]
    required += [f'stages.{i}.pos_embed' for i in range(NUM_STAGES)]
    required += [f'stages.{i}.blocks.0.{name}' for i in range(NUM_STAGES - 1)
                 for name in ('attn.bottleneck_conv.weight', 'attn.local_conv.weight',
                              'mlp.fc1.weight')]
    required += [f'stages.{NUM_STAGES - 1}.blocks.0.mlp.fc1.weight']
    missing = [key for key in required if key not in state_dict]
    if missing:
        raise ValueError(f'cannot read the SOFT architecture: the checkpoint lacks '
                         f'{missing}.')

    stem = _tensor_shape(state_dict, 'stages.0.patch_embed.proj.0.weight')
    embed_dims = [_tensor_shape(state_dict, 'stages.0.patch_embed.proj.6.weight')[0]]
    embed_dims += [_tensor_shape(state_dict, f'stages.{i}.patch_embed.proj.0.weight')[0]
                   for i in range(1, NUM_STAGES)]
    depths = []
    for i in range(NUM_STAGES):
        pattern = re.compile(rf'stages\.{i}\.blocks\.(\d+)\.')
        indices = {int(m[1]) for m in map(pattern.match, state_dict) if m}
        depths.append(len(indices))
        if indices != set(range(len(indices))):
            raise ValueError(f'stage {i + 1} has blocks {sorted(indices)}; expected '
                             f'consecutive indices from 0.')
    num_heads, sr_ratios, kernel_sizes, mlp_ratios = [], [], [], []
    for i in range(NUM_STAGES - 1):
        head_dims, _, ratio, _ = _tensor_shape(
            state_dict, f'stages.{i}.blocks.0.attn.bottleneck_conv.weight')
        heads, _, ksize, _ = _tensor_shape(
            state_dict, f'stages.{i}.blocks.0.attn.local_conv.weight')
        if heads * head_dims != embed_dims[i]:
            raise ValueError(
                f'stage {i + 1}: {heads} heads of width {head_dims} do not make '
                f'its width {embed_dims[i]}; the checkpoint is inconsistent.')
        num_heads.append(heads)
        sr_ratios.append(ratio)
        kernel_sizes.append(ksize)
        hidden = _tensor_shape(state_dict, f'stages.{i}.blocks.0.mlp.fc1.weight')[0]
        mlp_ratios.append(hidden / embed_dims[i])
    num_heads.append(None)
    mlp_ratios.append(_tensor_shape(state_dict, 'stages.3.blocks.0.mlp.fc1.weight')[0] /
                      embed_dims[3])
    mlp_ratios = [int(r) if float(r).is_integer() else r for r in mlp_ratios]
    return dict(embed_dims=list(embed_dims), num_heads=num_heads, depths=depths,
                sr_ratios=sr_ratios, local_kernel_sizes=kernel_sizes,
                mlp_ratios=mlp_ratios, stem_channels=stem[0], in_channels=stem[1],
                pretrain_img_size=_pretrain_img_size(state_dict))


def _pretrain_img_size(state_dict: Mapping) -> Optional[int]:
    """The image size whose stage grids the position embeddings hold, or None."""
    tokens = [state_dict[f'stages.{i}.pos_embed'].shape[1] - (i == NUM_STAGES - 1)
              for i in range(NUM_STAGES)]
    sides = [math.isqrt(n) if math.isqrt(n) ** 2 == n else None for n in tokens]
    if sides[0] is None:
        return None
    size = sides[0] * 4
    if sides != [size // 2**(i + 2) for i in range(NUM_STAGES)]:
        return None
    return size


def match_arch_name(settings: Mapping, arch_table: Mapping,
                    arch_defaults: Optional[Mapping] = None) -> Optional[str]:
    """The name in ``arch_table`` of the detected ``settings``, or None; the
    last stage's head count and bottleneck stride are in no shape and not
    compared."""
    compared = [(key, slice(None)) for key in (
        'embed_dims', 'depths', 'local_kernel_sizes', 'mlp_ratios')]
    compared += [(key, slice(NUM_STAGES - 1)) for key in ('num_heads', 'sr_ratios')]
    for name, arch in arch_table.items():
        table = dict(arch_defaults or {}, **arch)
        if (all(key in table for key, _ in compared)
                and all(list(table[key][part]) == list(settings[key][part])
                        for key, part in compared)
                and table.get('stem_channels') == settings['stem_channels']):
            return name
    return None


def rename_official_state_dict(state_dict: Mapping
                               ) -> Tuple[StateDict, List[str], List[str]]:
    """The tensors of an official state dict under mmsoft's keys, the dropped
    keys (``head.*``) and the wrapper prefixes removed.

    Raises:
        ValueError: Keys no rule places (all listed), or two keys mapping to one.
    """
    converted, origin = {}, {}
    unplaced, dropped, prefixes = [], [], set()
    for key, value in state_dict.items():
        bare = WRAPPER_PREFIXES.sub('', str(key))
        if bare != key:
            prefixes.add(str(key)[:len(str(key)) - len(bare)])
        if DROPPED_KEY.fullmatch(bare):
            dropped.append(key)
            continue
        new_key = rename_official_key(bare)
        if new_key is None or not isinstance(value, torch.Tensor):
            unplaced.append(key)
            continue
        if new_key in converted:
            raise ValueError(f'checkpoint keys {origin[new_key]!r} and {key!r} both '
                             f'map to {new_key!r}.')
        converted[new_key], origin[new_key] = value, key
    if unplaced:
        hint = ''
        if any(WRAPPER_PREFIXES.sub('', str(k)).startswith(
                ('patch_embeds.', 'stages.', 'pos_embeds.')) for k in unplaced):
            hint = (' Some keys are in the mmsoft layout already: load such files '
                    'with convert_weights=False.')
        if any(str(k).startswith(('neck.', 'rpn_head.', 'roi_head.', 'bbox_head.',
                                  'decode_head.', 'auxiliary_head.'))
               for k in unplaced):
            hint += (' The file looks like a detector or segmentor checkpoint: '
                     "load its backbone with convert_weights=False and "
                     "init_cfg.prefix='backbone.'.")
        raise ValueError(f'{len(unplaced)} checkpoint entries are not part of a '
                         f'reference SOFT model and cannot be placed: '
                         f'{key_list(unplaced, limit=None)}.{hint}')
    return converted, sorted(dropped), sorted(prefixes)


def check_detected_arch(converted: Mapping, settings: Mapping,
                        layout: Mapping) -> None:
    """Checks converted tensors against ``layout``, the state dict of a SOFT of
    ``settings`` (position embeddings left out without an image size).

    Raises:
        ValueError: Missing, unexpected or mis-shaped keys, all listed.
    """
    if settings['pretrain_img_size'] is None:
        converted = {k: v for k, v in converted.items() if not k.endswith('.pos_embed')}
        layout = {k: v for k, v in layout.items() if not k.endswith('.pos_embed')}
    fit_state_dict(converted, layout, context=f'the checkpoint does not fit the '
                   f'detected architecture {dict(settings)}')


def soft_official_to_mmsoft(checkpoint: Mapping, variant: Optional[str] = None,
                            name_hint: Optional[str] = None,
                            arch_table: Optional[Mapping] = None,
                            arch_defaults: Optional[Mapping] = None
                            ) -> Tuple[StateDict, dict]:
    """Converts an official SOFT / SOFT++ checkpoint to mmsoft's layout.

    Args:
        checkpoint (Mapping): A state dict, bare or under ``'state_dict'`` or
            ``'model'``; keys may carry ``module.`` / ``backbone.``.
        variant (str, optional): ``'soft'`` or ``'soft++'``. Default: None.
        name_hint (str, optional): The file name. Default: None.
        arch_table, arch_defaults (Mapping, optional): Named architectures
            to recognise the detected one among. Default: None.

    Returns:
        tuple[dict, dict]: The renamed tensors (``head.*`` dropped) and what
        was recognised: ``arch``, ``arch_settings``, ``variant``,
        ``variant_source``, ``variant_detected``, ``pretrain_img_size``,
        ``num_tensors``, ``dropped``, ``wrapper``, ``stripped_prefixes``.

    Raises:
        ValueError: Unplaced keys, shapes that give no architecture, or an
            unsupported ``variant``.
    """
    state_dict, wrapper = unwrap_state_dict(checkpoint)
    converted, dropped, prefixes = rename_official_state_dict(state_dict)
    settings = detect_soft_settings(converted)
    arch = match_arch_name(settings, arch_table or {}, arch_defaults)
    if arch is not None:  # the last stage's head count is in no tensor shape
        table = dict(arch_defaults or {}, **arch_table[arch])
        settings['num_heads'][-1] = table['num_heads'][-1]
    variant, source, detected = resolve_variant(checkpoint, variant, name_hint)
    info = dict(arch=arch, arch_settings=settings,
                variant=variant, variant_source=source,
                variant_detected=detected,
                pretrain_img_size=settings['pretrain_img_size'],
                num_tensors=len(converted), dropped=dropped, wrapper=wrapper,
                stripped_prefixes=prefixes)
    return converted, info


__all__ = [
    'OFFICIAL_VARIANTS', 'soft_official_to_mmsoft', 'rename_official_state_dict',
    'check_detected_arch', 'detect_soft_settings', 'match_arch_name',
    'rename_official_key', 'resolve_variant', 'variant_hint'
]
