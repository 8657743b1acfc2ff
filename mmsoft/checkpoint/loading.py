"""Checkpoint files into the backbones, strictly; does a file fit a model."""
import logging
import os.path as osp
import re
from typing import Callable, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from ..deprecations import rename_deprecated_keys
from .safe_load import load_checkpoint_file, load_checkpoint_safely
from .soft_official import soft_official_to_mmsoft
from .strict import (BN_COUNTER_KEYS, ResizeHook, StateDict, StateDictComparison,
                     compare_state_dict, fit_state_dict, grid_pos_embed_resizer,
                     key_list, select_prefix, strip_prefixes, unwrap_state_dict)

#: UFO-ViT keys a backbone checkpoint may lack: the resampling branches of
#: outputs 0 and 1, which an image classifier has not trained.
UFO_VIT_OPTIONAL_KEY = re.compile(
    r'pyramid\.branches\.\d+\..+|' + BN_COUNTER_KEYS.pattern)
RESIZE_NOTE = ('(position embeddings are resized only from a square grid of the '
               'same width.)')


def print_log(msg: str, level: int = logging.INFO) -> None:
    """Logs to mmengine's current logger, or without mmengine to ``mmsoft``'s."""
    try:
        from mmengine.logging import print_log as mmengine_print_log
    except ModuleNotFoundError as error:
        if error.name != 'mmengine':
            raise
        logging.getLogger('mmsoft').log(level, msg)
    else:
        mmengine_print_log(msg, logger='current', level=level)


def load_strictly(model: nn.Module, state_dict: Mapping, source: str,
                  optional: re.Pattern = BN_COUNTER_KEYS,
                  resize: Optional[ResizeHook] = None,
                  note: str = '') -> StateDictComparison:
    """Loads ``state_dict`` (earlier keys renamed) into ``model`` after
    :func:`fit_state_dict`, whose error names ``source`` and the model."""
    state_dict = rename_deprecated_keys(dict(state_dict),
                                        getattr(model, 'family', None))
    result = fit_state_dict(state_dict, model.state_dict(), optional=optional,
                            resize=resize, note=note, context=f'checkpoint {source} '
                            f'does not fit the {type(model).__name__} backbone')
    for key, (src, dst) in sorted(result.resized.items()):
        print_log(f'{key}: position embeddings resized from {src} to {dst}.')
    model.load_state_dict(result.fitted, strict=True)
    return result


def read_pretrained(filename: str, prefix: Optional[str] = None,
                    map_location='cpu') -> Tuple[Mapping, Mapping]:
    """A checkpoint file or URL and its state dict, only the entries under
    ``prefix`` when given (the error names the file)."""
    checkpoint = load_checkpoint_file(filename, map_location)
    state_dict, _ = unwrap_state_dict(checkpoint)
    if prefix:
        try:
            state_dict = select_prefix(state_dict, prefix)
        except ValueError as error:
            raise ValueError(f'checkpoint {filename}: {error}') from error
    return checkpoint, state_dict


def load_soft_checkpoint(model: nn.Module, filename: str, convert_weights: bool = False,
                         prefix: Optional[str] = None, map_location='cpu',
                         pos_embed_grids: Optional[Mapping] = None,
                         resize_pos_embed: Optional[Callable] = None,
                         variant: Optional[str] = None) -> dict:
    """Loads a checkpoint file into a SOFT backbone, strictly.

    Args:
        model (nn.Module): The backbone.
        filename (str): Path or URL.
        convert_weights (bool): An official SOFT file. Default: False.
        prefix (str, optional): Only the entries under it. Default: None.
        map_location: As for ``torch.load``. Default: 'cpu'.
        pos_embed_grids, resize_pos_embed: See :func:`grid_pos_embed_resizer`.
        variant (str, optional): A file of another variant is logged.

    Returns:
        dict: What the converter recognised, or the file's ``meta``.
    """
    checkpoint, state_dict = read_pretrained(filename, prefix, map_location)
    if convert_weights:
        try:
            state_dict, info = soft_official_to_mmsoft(
                state_dict if prefix else checkpoint, name_hint=osp.basename(filename))
        except ValueError as error:
            raise ValueError(f'checkpoint {filename}: {error}') from error
        print_log(f'converted reference SOFT checkpoint {filename}: '
                  f'variant={info["variant"]} ({info["variant_source"]}), '
                  f'{info["num_tensors"]} tensors.')
    else:
        state_dict = strip_prefixes(state_dict)
        meta = checkpoint.get('meta')
        info = dict(meta) if isinstance(meta, Mapping) else {}
    if isinstance(info.get('variant'), str) and info['variant'] != variant:
        print_log(f'{filename} holds {info["variant"]!r} weights but the backbone '
                  f'computes variant={variant!r}.', level=logging.WARNING)
    resize = None
    if pos_embed_grids:
        if resize_pos_embed is None:
            raise ValueError('pos_embed_grids needs resize_pos_embed, the model\'s '
                             'resize of grid embeddings; got None.')
        resize = grid_pos_embed_resizer(pos_embed_grids, resize_pos_embed)
    load_strictly(model, state_dict, filename, note=RESIZE_NOTE, resize=resize)
    return info


def load_ufo_vit_checkpoint(model: nn.Module, filename: str,
                            prefix: Optional[str] = None,
                            map_location='cpu') -> StateDict:
    """Loads a checkpoint file into a UFO-ViT backbone, strictly; only the
    untrained resampling branches may be missing. Returns the loaded tensors."""
    _, state_dict = read_pretrained(filename, prefix, map_location)
    result = load_strictly(model, strip_prefixes(state_dict), filename,
                           optional=UFO_VIT_OPTIONAL_KEY)
    if result.optional_missing:
        print_log(f'{filename}: {len(result.optional_missing)} tensors not in the '
                  f'checkpoint keep their initial values: '
                  f'{key_list(result.optional_missing)}.')
    return result.fitted


def innermost_model(model: nn.Module) -> nn.Module:
    """The model inside its wrappers (DDP, a TTA model, or both)."""
    while hasattr(model, 'module'):
        model = model.module
    return model


def load_state_dict_safely(path: str) -> StateDict:
    """The tensors of a checkpoint file, loaded by :func:`load_checkpoint_safely`,
    without ``module.``.

    Raises:
        ValueError: The file holds no dict.
    """
    checkpoint = load_checkpoint_safely(path)
    if not isinstance(checkpoint, dict):
        raise ValueError(f'checkpoint file {path} is not a model checkpoint: it '
                         f'holds a {type(checkpoint).__name__}, expected a dict')
    state_dict = strip_prefixes(unwrap_state_dict(checkpoint)[0],
                                re.compile(r'^module\.'))
    return {key: value for key, value in state_dict.items()
            if isinstance(value, torch.Tensor)}


def check_checkpoint_fits(path: str, model: nn.Module, config_path: str,
                          min_match: float = 0.5) -> None:
    """Raises a ``ValueError`` unless ``path`` loads safely and ``min_match``
    of the tensors of ``model`` (inside its wrappers) match it by name and
    shape."""
    expected = innermost_model(model).state_dict()
    result = compare_state_dict(load_state_dict_safely(path), expected)
    matched = len(expected) - len(result.missing) - len(result.mismatched)
    if matched < min_match * len(expected):
        raise ValueError(
            f'checkpoint file {path} does not fit the model of {config_path}: '
            f'only {matched} of {len(expected)} weight tensors match by name '
            f'and shape ({result.describe(limit=3)}); is it a checkpoint of '
            f'another model?')
