"""Loading the reference SOFT / SOFT++ ImageNet checkpoints into :class:`SOFT`.

The reference implementation (fudan-zvg/SOFT, timm-based) names its modules
``patch_embed1``, ``block1.0.att.mha.W_q``, ``block4.0.attn.q``, ... Every
tensor of its classification model except the classifier (``head.*``) has
exactly one counterpart in :class:`~mmsoft.models.backbones.SOFT`;
:func:`soft_official_to_mmsoft` renames them and refuses anything it cannot
place.

Attention variant. The plain SOFT models and the SOFT++ ("norm") models have
identical parameters, so the variant cannot be read off the tensors. It is
taken, in this order, from:

1. the ``attention`` argument (``--attention`` of
   ``tools/model_converters/soft2mmsoft.py``);
2. the checkpoint's own metadata: training checkpoints written by timm store
   the model name (``arch``, e.g. ``'soft_norm_tiny'``, and ``args.model``);
   a name containing ``norm`` means ``'soft++'``, another ``soft_<size>`` or
   ``softmaxfreevisiontransformer`` name means ``'soft'``;
3. the file name: ``norm`` in it (``SOFT_Tiny_norm.pth``) means ``'soft++'``;
   ``soft_<size>`` without ``norm`` (``SOFT_Tiny.pth``) means ``'soft'``.

When none of these decides, the variant is reported as None: the command-line
converter then asks for ``--attention``, and the backbone uses its own
``attention`` setting.

:func:`load_soft_checkpoint` is what ``SOFT(convert_weights=..., init_cfg=
dict(type='Pretrained', checkpoint=...))`` runs: it reads the file, converts
it when asked, bilinearly resizes position embeddings learned at another image
size and checks every other key and shape strictly.
"""
import argparse
import logging
import math
import os.path as osp
import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader

from ..models.layers import resize_pos_embed
from ..models.backbones.soft import ARCH_DEFAULTS, ARCH_SETTINGS, ATTENTIONS, NUM_STAGES

StateDict = Dict[str, torch.Tensor]

#: Leading key prefixes removed before renaming (DataParallel, detectors).
STRIPPED_PREFIXES = ('module.', 'backbone.')
#: Reference keys that have no counterpart in the backbone.
DROPPED_KEY = re.compile(r'head\..+')

_BN_PARAM = r'(?P<param>weight|bias|running_mean|running_var|num_batches_tracked)'
_AFFINE_PARAM = r'(?P<param>weight|bias)'
_SOFT_BLOCK = r'block(?P<stage>[123])\.(?P<block>0|[1-9]\d*)\.att\.'
_SOFT_TARGET = 'stages.{stage}.{block}.'

# (pattern over a whole reference key, template of the mmsoft key). Named group
# ``stage`` is 1-based in the reference and 0-based in mmsoft.
KEY_RULES: List[Tuple[re.Pattern, str]] = [
    (rf'patch_embed(?P<stage>1)\.proj\.(?P<layer>[013467])\.{_BN_PARAM}',
     'patch_embeds.{stage}.proj.{layer}.{param}'),
    (rf'patch_embed(?P<stage>[234])\.proj\.(?P<layer>[01])\.{_BN_PARAM}',
     'patch_embeds.{stage}.proj.{layer}.{param}'),
    (r'pos_embed(?P<stage>[1-4])', 'pos_embeds.{stage}'),
    (r'cls_token', 'cls_token'),
    (rf'{_SOFT_BLOCK}mha\.W_q\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.q_proj.{param}'),
    (rf'{_SOFT_BLOCK}mha\.W_v\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.v_proj.{param}'),
    (rf'{_SOFT_BLOCK}mha\.attn\.Qlandmark_op\.weight',
     _SOFT_TARGET + 'attn.bottleneck_conv.weight'),
    (rf'{_SOFT_BLOCK}mha\.attn\.Qnorm_act\.0\.{_AFFINE_PARAM}',
     _SOFT_TARGET + 'attn.bottleneck_norm.{param}'),
    (rf'{_SOFT_BLOCK}mha\.attn\.conv\.weight', _SOFT_TARGET + 'attn.local_conv.weight'),
    (rf'{_SOFT_BLOCK}mha\.ff\.{_AFFINE_PARAM}', _SOFT_TARGET + 'attn.out_proj.{param}'),
    (rf'{_SOFT_BLOCK}norm1\.{_AFFINE_PARAM}', _SOFT_TARGET + 'norm1.{param}'),
    (rf'{_SOFT_BLOCK}ff1\.{_AFFINE_PARAM}', _SOFT_TARGET + 'ffn.fc1.{param}'),
    (rf'{_SOFT_BLOCK}ff2\.{_AFFINE_PARAM}', _SOFT_TARGET + 'ffn.fc2.{param}'),
    (rf'{_SOFT_BLOCK}norm2\.{_AFFINE_PARAM}', _SOFT_TARGET + 'norm2.{param}'),
    (r'block(?P<stage>4)\.(?P<block>0|[1-9]\d*)\.'
     r'(?P<name>norm1|attn\.q|attn\.kv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.'
     + _AFFINE_PARAM, 'stages.{stage}.{block}.{name}.{param}'),
    (rf'norm\.{_AFFINE_PARAM}', 'norm.{param}'),
]
KEY_RULES = [(re.compile(pattern), template) for pattern, template in KEY_RULES]

_SIZES = r'(tiny|small|medium|large|huge)'


def rename_official_key(key: str) -> Optional[str]:
    """The mmsoft name of a reference key, or None when no rule places it.

    Args:
        key (str): A reference key without wrapper prefixes, e.g.
            ``'block1.0.att.mha.W_q.weight'``.

    Returns:
        str | None: e.g. ``'stages.0.0.attn.q_proj.weight'``.
    """
    for pattern, template in KEY_RULES:
        match = pattern.fullmatch(key)
        if match:
            fields = match.groupdict()
            if 'stage' in fields:
                fields['stage'] = int(fields['stage']) - 1
            return template.format(**fields)
    return None


def unwrap_state_dict(checkpoint: Mapping) -> Tuple[Mapping, Optional[str]]:
    """The state dict inside ``checkpoint`` and the wrapper key it came from.

    ``checkpoint['state_dict']`` (mmengine, timm) is preferred over
    ``checkpoint['model']`` (DeiT-style scripts); a mapping without either is
    taken as a bare state dict.

    Args:
        checkpoint (Mapping): A loaded checkpoint.

    Returns:
        tuple[Mapping, str | None]: The state dict and ``'state_dict'``,
        ``'model'`` or None.
    """
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f'a checkpoint must be a mapping (a state dict or a dict '
                         f'holding one); got {type(checkpoint).__name__}.')
    for wrapper in ('state_dict', 'model'):
        if isinstance(checkpoint.get(wrapper), Mapping):
            return checkpoint[wrapper], wrapper
    return checkpoint, None


def strip_key_prefixes(key: str, prefixes: Tuple[str, ...] = STRIPPED_PREFIXES
                       ) -> Tuple[str, str]:
    """Removes leading ``prefixes`` (repeatedly, in any order) from ``key``.

    Returns:
        tuple[str, str]: The stripped key and what was removed.
    """
    removed = ''
    stripped = True
    while stripped:
        stripped = False
        for prefix in prefixes:
            if key.startswith(prefix):
                key = key[len(prefix):]
                removed += prefix
                stripped = True
    return key, removed


def attention_hint(text: Optional[str]) -> Optional[str]:
    """The attention variant a model or file name points to, if any.

    Args:
        text (str | None): e.g. ``'soft_norm_tiny'``, ``'SOFT_Tiny.pth'``.

    Returns:
        str | None: ``'soft++'`` when the name contains ``norm``, ``'soft'``
        for another reference model name (``soft_<size>``,
        ``softmaxfreevisiontransformer``), None otherwise.
    """
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
    model = args.get('model') if isinstance(args, Mapping) else getattr(args, 'model',
                                                                         None)
    if isinstance(model, str):
        names.append(model)
    return names


def resolve_attention(checkpoint: Mapping, attention: Optional[str] = None,
                      name_hint: Optional[str] = None
                      ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """Decides the attention variant of a reference checkpoint.

    Args:
        checkpoint (Mapping): The loaded checkpoint (wrapper included).
        attention (str, optional): ``'soft'`` or ``'soft++'`` given by the
            user; it takes precedence.
        name_hint (str, optional): The checkpoint's file name.

    Returns:
        tuple: ``(attention, source, detected)``: the variant (None when
        undecided), where it came from (``'argument'``, ``'checkpoint
        metadata'``, ``'file name'`` or None) and the variant the checkpoint
        itself points to (None when it points to none), which may differ from
        an explicit ``attention``.
    """
    if attention is not None and attention not in ATTENTIONS:
        raise ValueError(f'attention={attention!r} is not supported; expected one '
                         f'of {list(ATTENTIONS)}.')
    detected, source = None, None
    meta_hints = {attention_hint(name) for name in _metadata_model_names(checkpoint)}
    meta_hints.discard(None)
    if len(meta_hints) == 1:
        detected, source = meta_hints.pop(), 'checkpoint metadata'
    elif attention_hint(osp.basename(name_hint or '')) is not None:
        detected, source = attention_hint(osp.basename(name_hint)), 'file name'
    if attention is not None:
        return attention, 'argument', detected
    return detected, source, detected


def _tensor_shape(state_dict: Mapping, key: str) -> torch.Size:
    return state_dict[key].shape


def detect_soft_settings(state_dict: Mapping) -> dict:
    """Reads the architecture of a SOFT state dict (mmsoft key layout).

    Widths come from the patch-embedding convolutions, depths from the block
    indices, head widths and bottleneck strides from the bottleneck
    convolutions, head counts and local kernel sizes from the depth-wise
    convolutions, the training image size from the position embeddings.
    The last stage's head count is not stored in any shape and is None.

    Args:
        state_dict (Mapping): Tensors in the mmsoft key layout.

    Returns:
        dict: ``embed_dims``, ``num_heads``, ``depths``, ``sr_ratios``
        (3 values), ``local_kernel_sizes``, ``mlp_ratios``, ``stem_channels``,
        ``in_channels`` and ``pretrain_img_size`` (None unless the
        position-embedding grids are square and consistent).
    """
    required = ['patch_embeds.0.proj.0.weight', 'patch_embeds.0.proj.6.weight']
    required += [f'patch_embeds.{i}.proj.0.weight' for i in range(1, NUM_STAGES)]
    required += [f'pos_embeds.{i}' for i in range(NUM_STAGES)]
    required += [f'stages.{i}.0.{name}' for i in range(NUM_STAGES - 1) for name in (
        'attn.bottleneck_conv.weight', 'attn.local_conv.weight', 'ffn.fc1.weight')]
    required += [f'stages.{NUM_STAGES - 1}.0.mlp.fc1.weight']
    missing = [key for key in required if key not in state_dict]
    if missing:
        raise ValueError(f'cannot read the SOFT architecture: the checkpoint lacks '
                         f'{missing}.')

    stem = _tensor_shape(state_dict, 'patch_embeds.0.proj.0.weight')
    embed_dims = [_tensor_shape(state_dict, 'patch_embeds.0.proj.6.weight')[0]]
    embed_dims += [_tensor_shape(state_dict, f'patch_embeds.{i}.proj.0.weight')[0]
                   for i in range(1, NUM_STAGES)]
    depths = []
    for i in range(NUM_STAGES):
        pattern = re.compile(rf'stages\.{i}\.(\d+)\.')
        indices = {int(m[1]) for m in map(pattern.match, state_dict) if m}
        depths.append(len(indices))
        if indices != set(range(len(indices))):
            raise ValueError(f'stage {i + 1} has blocks {sorted(indices)}; expected '
                             f'consecutive indices from 0.')
    num_heads, sr_ratios, kernel_sizes, mlp_ratios = [], [], [], []
    for i in range(NUM_STAGES - 1):
        head_dims, _, ratio, _ = _tensor_shape(
            state_dict, f'stages.{i}.0.attn.bottleneck_conv.weight')
        heads, _, ksize, _ = _tensor_shape(state_dict,
                                           f'stages.{i}.0.attn.local_conv.weight')
        if heads * head_dims != embed_dims[i]:
            raise ValueError(
                f'stage {i + 1}: {heads} heads of width {head_dims} do not make '
                f'its width {embed_dims[i]}; the checkpoint is inconsistent.')
        num_heads.append(heads)
        sr_ratios.append(ratio)
        kernel_sizes.append(ksize)
        mlp_ratios.append(_tensor_shape(state_dict, f'stages.{i}.0.ffn.fc1.weight')[0] /
                          embed_dims[i])
    num_heads.append(None)
    mlp_ratios.append(_tensor_shape(state_dict, 'stages.3.0.mlp.fc1.weight')[0] /
                      embed_dims[3])
    mlp_ratios = [int(r) if float(r).is_integer() else r for r in mlp_ratios]
    return dict(embed_dims=list(embed_dims), num_heads=num_heads, depths=depths,
                sr_ratios=sr_ratios, local_kernel_sizes=kernel_sizes,
                mlp_ratios=mlp_ratios, stem_channels=stem[0], in_channels=stem[1],
                pretrain_img_size=_pretrain_img_size(state_dict))


def _square_side(tokens: int) -> Optional[int]:
    side = math.isqrt(tokens)
    return side if side * side == tokens else None


def _pretrain_img_size(state_dict: Mapping) -> Optional[int]:
    """Image size whose stage grids (size / 4, / 8, ...) the position
    embeddings hold, or None when they are not such grids."""
    sides = [
        _square_side(state_dict[f'pos_embeds.{i}'].shape[1] - (i == NUM_STAGES - 1))
        for i in range(NUM_STAGES)
    ]
    if sides[0] is None:
        return None
    size = sides[0] * 4
    if sides != [size // 2**(i + 2) for i in range(NUM_STAGES)]:
        return None
    return size


def expected_soft_shapes(settings: dict) -> Dict[str, torch.Size]:
    """Every state-dict entry of :class:`SOFT` with its shape.

    Args:
        settings (dict): As returned by :func:`detect_soft_settings` (the
            last stage's head count is not needed). ``pretrain_img_size``
            None leaves the position embeddings out.

    Returns:
        dict[str, torch.Size]: mmsoft keys and shapes.
    """
    dims, depths = settings['embed_dims'], settings['depths']
    stem, in_channels = settings['stem_channels'], settings['in_channels']
    shapes = {}

    def conv_bn(prefix, cin, cout):
        shapes[f'{prefix}.weight'] = (cout, cin, 3, 3)
        shapes[f'{prefix}.bias'] = (cout, )

    def batch_norm(prefix, channels):
        for name in ('weight', 'bias', 'running_mean', 'running_var'):
            shapes[f'{prefix}.{name}'] = (channels, )
        shapes[f'{prefix}.num_batches_tracked'] = ()

    def affine(prefix, cin, cout=None):
        if cout is None:  # LayerNorm
            shapes[f'{prefix}.weight'] = shapes[f'{prefix}.bias'] = (cin, )
        else:
            shapes[f'{prefix}.weight'] = (cout, cin)
            shapes[f'{prefix}.bias'] = (cout, )

    widths = [in_channels, stem, stem, dims[0]]
    for layer in range(3):
        conv_bn(f'patch_embeds.0.proj.{3 * layer}', widths[layer], widths[layer + 1])
        batch_norm(f'patch_embeds.0.proj.{3 * layer + 1}', widths[layer + 1])
    for i in range(1, NUM_STAGES):
        conv_bn(f'patch_embeds.{i}.proj.0', dims[i - 1], dims[i])
        batch_norm(f'patch_embeds.{i}.proj.1', dims[i])
    size = settings.get('pretrain_img_size')
    if size is not None:
        for i in range(NUM_STAGES):
            shapes[f'pos_embeds.{i}'] = (1, (size // 2**(i + 2))**2 + (i == 3), dims[i])
    shapes['cls_token'] = (1, 1, dims[3])
    for i in range(NUM_STAGES - 1):
        width, heads = dims[i], settings['num_heads'][i]
        head_dims, hidden = width // heads, int(width * settings['mlp_ratios'][i])
        ratio, ksize = settings['sr_ratios'][i], settings['local_kernel_sizes'][i]
        for j in range(depths[i]):
            p = f'stages.{i}.{j}'
            affine(f'{p}.attn.q_proj', width, width)
            affine(f'{p}.attn.v_proj', width, width)
            shapes[f'{p}.attn.bottleneck_conv.weight'] = (head_dims, head_dims, ratio,
                                                          ratio)
            affine(f'{p}.attn.bottleneck_norm', head_dims)
            shapes[f'{p}.attn.local_conv.weight'] = (heads, 1, ksize, ksize)
            affine(f'{p}.attn.out_proj', width, width)
            affine(f'{p}.norm1', width)
            affine(f'{p}.ffn.fc1', width, hidden)
            affine(f'{p}.ffn.fc2', hidden, width)
            affine(f'{p}.norm2', width)
    width = dims[3]
    hidden = int(width * settings['mlp_ratios'][3])
    for j in range(depths[3]):
        p = f'stages.3.{j}'
        affine(f'{p}.norm1', width)
        affine(f'{p}.attn.q', width, width)
        affine(f'{p}.attn.kv', width, 2 * width)
        affine(f'{p}.attn.proj', width, width)
        affine(f'{p}.norm2', width)
        affine(f'{p}.mlp.fc1', width, hidden)
        affine(f'{p}.mlp.fc2', hidden, width)
    affine('norm', width)
    return {key: torch.Size(shape) for key, shape in shapes.items()}


def match_arch_name(settings: dict) -> Optional[str]:
    """The name in :data:`ARCH_SETTINGS` whose settings equal ``settings``.

    The last stage's head count (absent from checkpoints) is not compared.
    """
    for name, arch in ARCH_SETTINGS.items():
        table = dict(ARCH_DEFAULTS, **arch)
        if (list(table['embed_dims']) == settings['embed_dims']
                and list(table['num_heads'][:3]) == settings['num_heads'][:3]
                and list(table['depths']) == settings['depths']
                and list(table['sr_ratios'][:3]) == settings['sr_ratios']
                and list(table['local_kernel_sizes']) == settings['local_kernel_sizes']
                and list(table['mlp_ratios']) == settings['mlp_ratios']
                and table['stem_channels'] == settings['stem_channels']):
            return name
    return None


def _key_list(keys: List[str], limit: Optional[int] = 30) -> str:
    keys = sorted(keys)
    text = ', '.join(keys[:limit])
    if limit is not None and len(keys) > limit:
        text += f', ... ({len(keys) - limit} more)'
    return text


def soft_official_to_mmsoft(checkpoint: Mapping, attention: Optional[str] = None,
                            name_hint: Optional[str] = None) -> Tuple[StateDict, dict]:
    """Converts a reference SOFT / SOFT++ checkpoint to the mmsoft layout.

    Args:
        checkpoint (Mapping): A bare state dict of the reference model, or a
            dict holding it under ``'state_dict'`` or ``'model'``. Keys may
            carry leading ``module.`` / ``backbone.`` prefixes.
        attention (str, optional): ``'soft'`` or ``'soft++'``; see the module
            docstring for how it is otherwise decided. Default: None.
        name_hint (str, optional): The checkpoint's file name, used to decide
            the attention variant when neither ``attention`` nor the
            checkpoint's metadata does. Default: None.

    Returns:
        tuple[dict, dict]: The converted state dict (the tensors themselves,
        renamed; ``head.*`` dropped) and what was recognised: ``arch`` (a
        name of ``SOFT.ARCH_SETTINGS`` or None), ``arch_settings`` (see
        :func:`detect_soft_settings`; the last stage's head count is taken
        from the arch table when ``arch`` is named, None otherwise),
        ``attention`` (None when undecided), ``attention_source``,
        ``attention_detected``, ``pretrain_img_size``, ``num_tensors``,
        ``dropped`` (keys), ``wrapper`` and ``stripped_prefixes``.

    Raises:
        ValueError: Keys that no rule places (all listed), two keys mapping
            to one name, keys missing for the detected architecture, or
            shapes inconsistent with it.
    """
    state_dict, wrapper = unwrap_state_dict(checkpoint)
    converted, origin = {}, {}
    unplaced, dropped, prefixes = [], [], set()
    for key, value in state_dict.items():
        bare, removed = strip_key_prefixes(str(key))
        if removed:
            prefixes.add(removed)
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
        if any(k.startswith(('patch_embeds.', 'stages.', 'pos_embeds.'))
               for k in map(lambda k: strip_key_prefixes(str(k))[0], unplaced)):
            hint = (' Some keys are in the mmsoft layout already: load such files '
                    'with convert_weights=False.')
        raise ValueError(f'{len(unplaced)} checkpoint entries are not part of a '
                         f'reference SOFT model and cannot be placed: '
                         f'{_key_list(unplaced, limit=None)}.{hint}')

    settings = detect_soft_settings(converted)
    expected = expected_soft_shapes(settings)
    missing = [key for key in expected if key not in converted]
    if settings['pretrain_img_size'] is None:
        missing = [key for key in missing if not key.startswith('pos_embeds.')]
    if missing:
        raise ValueError(f'the checkpoint lacks {len(missing)} tensors of the '
                         f'detected architecture {settings}: {_key_list(missing)}.')
    mismatched = [f'{key}: {tuple(value.shape)} (expected {tuple(expected[key])})'
                  for key, value in converted.items()
                  if key in expected and value.shape != expected[key]]
    if mismatched:
        raise ValueError(f'shapes inconsistent with the detected architecture '
                         f'{settings}: {"; ".join(mismatched)}.')

    arch = match_arch_name(settings)
    if arch is not None:  # the last stage's head count is in no tensor shape
        settings['num_heads'][-1] = ARCH_SETTINGS[arch]['num_heads'][-1]
    attention, source, detected = resolve_attention(checkpoint, attention, name_hint)
    info = dict(arch=arch, arch_settings=settings,
                attention=attention, attention_source=source,
                attention_detected=detected,
                pretrain_img_size=settings['pretrain_img_size'],
                num_tensors=len(converted), dropped=sorted(dropped), wrapper=wrapper,
                stripped_prefixes=sorted(prefixes))
    return converted, info


def load_checkpoint_file(filename: str, map_location='cpu') -> Mapping:
    """Loads a checkpoint with mmengine's loaders (paths, URLs, ...).

    Tensors are unpickled with ``weights_only`` semantics; ``argparse.Namespace``
    is allowed in addition, as timm training checkpoints store their
    arguments as one.
    """
    with torch.serialization.safe_globals([argparse.Namespace]):
        return CheckpointLoader.load_checkpoint(filename, map_location=map_location)


def _select_prefix(state_dict: Mapping, prefix: str) -> Dict[str, torch.Tensor]:
    """Entries under ``prefix`` (e.g. ``'backbone.'``) with the prefix removed."""
    if not prefix.endswith('.'):
        prefix += '.'
    selected = {k[len(prefix):]: v for k, v in state_dict.items()
                if str(k).startswith(prefix)}
    if not selected:
        raise ValueError(f'the checkpoint has no keys starting with {prefix!r}.')
    return selected


def pos_embed_source_side(value: torch.Tensor, stage: int,
                          shape: torch.Size) -> Optional[int]:
    """Side of the square grid a checkpoint's position embeddings hold, or
    None when they cannot be resized to ``shape`` (other width, not square).
    """
    if value.dim() != 3 or value.shape[0] != 1 or value.shape[2] != shape[2]:
        return None
    return _square_side(value.shape[1] - (stage == NUM_STAGES - 1))


def resize_checkpoint_pos_embed(value: torch.Tensor, stage: int, side: int,
                                grid: Tuple[int, int]) -> torch.Tensor:
    """Bilinearly resizes a stage's position embeddings to ``grid``.

    The last stage's first entry (class token) is kept as is.

    Args:
        value (Tensor): Checkpoint embeddings, (1, side*side [+1], C).
        stage (int): 0-based stage; stage 3 carries the class-token entry.
        side (int): Side of the checkpoint's square grid.
        grid (tuple[int, int]): The model's grid (H, W).

    Returns:
        Tensor: Shape (1, H*W [+1], C).
    """
    has_cls = stage == NUM_STAGES - 1
    tokens = value[:, 1:] if has_cls else value
    resized = resize_pos_embed(tokens.float(), (side, side), grid).to(value.dtype)
    if has_cls:
        resized = torch.cat((value[:, :1], resized), dim=1)
    return resized


def fit_state_dict_to_soft(model: nn.Module, state_dict: Mapping,
                           logger='current') -> Dict[str, torch.Tensor]:
    """Checks an mmsoft-layout state dict against ``model`` and adapts it.

    Position embeddings of another grid size are resized to the model's
    (``model.pos_grids``); missing ``num_batches_tracked`` counters are
    taken from the model. Everything else must match exactly.

    Args:
        model (nn.Module): A :class:`SOFT` backbone.
        state_dict (Mapping): Tensors in the mmsoft key layout.
        logger: Where resizing is reported (``print_log`` logger).

    Returns:
        dict[str, Tensor]: A state dict ``model.load_state_dict(...,
        strict=True)`` accepts.

    Raises:
        ValueError: Unexpected or missing keys (all listed), or a shape
            mismatch (key and both shapes).
    """
    target = model.state_dict()
    unexpected = [k for k in state_dict if k not in target]
    missing = [k for k in target if k not in state_dict
               and not k.endswith('num_batches_tracked')]
    if unexpected or missing:
        parts = []
        if unexpected:
            parts.append(f'unexpected keys: {_key_list(unexpected)}')
        if missing:
            parts.append(f'missing keys: {_key_list(missing)}')
        raise ValueError('the checkpoint does not fit the SOFT backbone; '
                         + '; '.join(parts) + '.')
    fitted, mismatched = {}, []
    for key, expected in target.items():
        if key not in state_dict:
            fitted[key] = expected
            continue
        value = state_dict[key]
        if value.shape != expected.shape and key.startswith('pos_embeds.'):
            stage = int(key.split('.')[1])
            side = pos_embed_source_side(value, stage, expected.shape)
            if side is not None:
                value = resize_checkpoint_pos_embed(value, stage, side,
                                                    model.pos_grids[stage])
                print_log(f'{key}: position embeddings resized from '
                          f'{tuple(state_dict[key].shape)} to '
                          f'{tuple(expected.shape)}.', logger=logger)
        if value.shape != expected.shape:
            mismatched.append(f'{key}: checkpoint {tuple(value.shape)}, model '
                              f'{tuple(expected.shape)}')
        fitted[key] = value
    if mismatched:
        raise ValueError('size mismatch for ' + '; '.join(mismatched) + ' (position '
                         'embeddings are resized only from a square grid of the '
                         'same width).')
    return fitted


def load_soft_checkpoint(model: nn.Module, filename: str, convert_weights: bool = False,
                         prefix: Optional[str] = None, map_location='cpu',
                         logger='current') -> dict:
    """Loads a checkpoint file into a :class:`SOFT` backbone, strictly.

    Args:
        model (nn.Module): The backbone.
        filename (str): Path or URL (anything mmengine's ``CheckpointLoader``
            reads).
        convert_weights (bool): The file is a reference (official)
            checkpoint to convert with :func:`soft_official_to_mmsoft`.
            Otherwise it is in the mmsoft layout, e.g. written by
            ``tools/model_converters/soft2mmsoft.py``. Default: False.
        prefix (str, optional): Load only the entries under this prefix
            (e.g. ``'backbone.'`` of a detector checkpoint). Default: None.
        map_location: As for ``torch.load``. Default: ``'cpu'``.
        logger: ``print_log`` logger. Default: ``'current'``.

    Returns:
        dict: What the converter recognised (``convert_weights``), or the
        file's ``meta`` entry (may be empty).

    Raises:
        ValueError: A checkpoint that does not fit the model (see
            :func:`fit_state_dict_to_soft` and :func:`soft_official_to_mmsoft`).
    """
    checkpoint = load_checkpoint_file(filename, map_location)
    source = checkpoint
    if prefix:
        source = _select_prefix(unwrap_state_dict(checkpoint)[0], prefix)
    if convert_weights:
        state_dict, info = soft_official_to_mmsoft(source,
                                                   name_hint=osp.basename(filename))
        print_log(f'converted reference SOFT checkpoint {filename}: '
                  f'arch={info["arch"]}, attention={info["attention"]} '
                  f'({info["attention_source"]}), {info["num_tensors"]} tensors.',
                  logger=logger)
    else:
        state_dict = {strip_key_prefixes(str(k))[0]: v
                      for k, v in unwrap_state_dict(source)[0].items()}
        meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
        info = dict(meta) if isinstance(meta, Mapping) else {}
    file_attention = info.get('attention')
    model_attention = getattr(model, 'attention', None)
    if file_attention in ATTENTIONS and file_attention != model_attention:
        print_log(f'{filename} holds {file_attention!r} weights but the backbone '
                  f'computes attention={model_attention!r}.', logger=logger,
                  level=logging.WARNING)
    state_dict = fit_state_dict_to_soft(model, state_dict, logger)
    model.load_state_dict(state_dict, strict=True)
    return info


__all__ = [
    'soft_official_to_mmsoft', 'load_soft_checkpoint', 'load_checkpoint_file',
    'fit_state_dict_to_soft', 'detect_soft_settings', 'expected_soft_shapes',
    'rename_official_key', 'resolve_attention', 'attention_hint'
]
