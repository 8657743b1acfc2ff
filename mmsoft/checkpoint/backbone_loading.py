"""Strict loading of checkpoint files into the backbones.

The loaders read a file, take the state dict out of its wrapper, keep the
entries under ``prefix`` when one is given, strip leading ``module.`` /
``backbone.``, compare every key and shape with ``model.state_dict()`` and
load with ``strict=True``.
"""
import contextlib
import logging
import os.path as osp
import re
from typing import Iterator, Mapping, Optional, Tuple

import torch.nn as nn

from ..deprecations import rename_deprecated_keys
from .pos_embed import RESIZE_NOTE, GridResize, PosEmbedGrids, grid_pos_embed_resizer
from .safe_load import load_checkpoint_file
from .soft_official import soft_official_to_mmsoft
from .state_dict import (StateDict, key_list, select_prefix, strip_prefixes,
                         unwrap_state_dict)
from .strict import (BN_COUNTER_KEYS, OptionalKeys, ResizeHook,
                     StateDictComparison, fit_state_dict)


def print_log(msg: str, logger='current', level=logging.INFO) -> None:
    """mmengine's ``print_log`` (the runner's log) where mmengine is
    installed; the ``mmsoft`` logger of Python's ``logging`` elsewhere."""
    try:
        from mmengine.logging import print_log as mmengine_print_log
    except ModuleNotFoundError as error:
        if error.name != 'mmengine':
            raise
        logging.getLogger('mmsoft').log(level, msg)
    else:
        mmengine_print_log(msg, logger=logger, level=level)


#: UFO-ViT keys a backbone checkpoint may lack: the resampling branches of
#: outputs 0 and 1, absent from an image classifier's backbone.
UFO_VIT_OPTIONAL_KEY = re.compile(r'pyramid\.branches\.\d+\..+')


def ufo_vit_optional_key(key: str) -> bool:
    """Whether a UFO-ViT checkpoint may lack ``key``: an untrained output
    branch or a BatchNorm counter."""
    return bool(UFO_VIT_OPTIONAL_KEY.fullmatch(key) or BN_COUNTER_KEYS.fullmatch(key))


def read_pretrained(filename: str, prefix: Optional[str] = None,
                    map_location='cpu') -> Tuple[Mapping, Mapping]:
    """A checkpoint file and the state dict it holds.

    Args:
        filename (str): Path or URL.
        prefix (str, optional): Keep only the entries under it (e.g.
            ``'backbone.'`` of a detector checkpoint), prefix removed.
            Default: None.
        map_location: As for ``torch.load``. Default: ``'cpu'``.

    Returns:
        tuple[Mapping, Mapping]: The checkpoint and its state dict (still
        with any ``module.`` / ``backbone.`` prefixes when ``prefix`` is
        None).

    Raises:
        ValueError: No key starts with ``prefix``.
    """
    checkpoint = load_checkpoint_file(filename, map_location)
    state_dict, _ = unwrap_state_dict(checkpoint)
    if prefix:
        with naming_file(filename):
            state_dict = select_prefix(state_dict, prefix)
    return checkpoint, state_dict


@contextlib.contextmanager
def naming_file(filename: str) -> Iterator[None]:
    """Re-raises a ``ValueError`` of the block with ``filename`` in front."""
    try:
        yield
    except ValueError as err:
        if filename in str(err):
            raise
        raise ValueError(f'checkpoint {filename}: {err}') from err


def load_strictly(model: nn.Module, state_dict: Mapping, source: str,
                  optional: OptionalKeys = BN_COUNTER_KEYS,
                  resize: Optional[ResizeHook] = None, note: str = '',
                  logger='current') -> StateDictComparison:
    """Loads ``state_dict`` into ``model`` after a strict comparison.

    Args:
        model (nn.Module): The backbone.
        state_dict (Mapping): Tensors in the model's key layout.
        source (str): The file, named in the messages.
        optional, resize: See :func:`~mmsoft.checkpoint.strict.compare_state_dict`.
            Default: missing ``num_batches_tracked`` tolerated, no resizing.
        note (str): Added to a shape-mismatch error. Default: ``''``.
        logger: ``print_log`` logger. Default: ``'current'``.

    Returns:
        StateDictComparison: What was loaded, resized and left out.

    Raises:
        ValueError: ``'checkpoint <source> does not fit the <Model>
            backbone: missing keys: ...; unexpected keys: ...; shape
            mismatches: ...'``.
    """
    state_dict = rename_deprecated_keys(dict(state_dict),
                                        getattr(model, 'deprecation_name', None))
    result = fit_state_dict(
        state_dict, model.state_dict(), optional=optional, resize=resize, note=note,
        context=f'checkpoint {source} does not fit the {type(model).__name__} '
        f'backbone')
    for key, (src, dst) in sorted(result.resized.items()):
        print_log(f'{key}: position embeddings resized from {src} to {dst}.',
                  logger=logger)
    model.load_state_dict(result.fitted, strict=True)
    return result


def load_soft_checkpoint(model: nn.Module, filename: str, convert_weights: bool = False,
                         prefix: Optional[str] = None, map_location='cpu',
                         pos_embed_grids: Optional[PosEmbedGrids] = None,
                         resize_pos_embed: Optional[GridResize] = None,
                         variant: Optional[str] = None,
                         logger='current') -> dict:
    """Loads a checkpoint file into a SOFT backbone, strictly.

    Args:
        model (nn.Module): The backbone; only its ``state_dict()`` and
            ``load_state_dict()`` are used.
        filename (str): Path or URL (anything mmengine's ``CheckpointLoader``
            reads).
        convert_weights (bool): The file is a reference checkpoint, converted
            with :func:`~mmsoft.checkpoint.soft_official.soft_official_to_mmsoft`;
            otherwise it is in the mmsoft layout. Default: False.
        prefix (str, optional): Load only the entries under this prefix
            (e.g. ``'backbone.'`` of a detector checkpoint). Default: None.
        map_location: As for ``torch.load``. Default: ``'cpu'``.
        pos_embed_grids (Mapping, optional): Position-embedding key -> (the
            model's grid (H, W), number of leading extra entries); such
            tensors of another square grid are resized (see
            :func:`~mmsoft.checkpoint.pos_embed.grid_pos_embed_resizer`).
            Default: None (nothing is resized).
        resize_pos_embed (callable, optional): The model's resize of grid
            embeddings, needed with ``pos_embed_grids``. Default: None.
        variant (str, optional): The model's variant (``'soft'`` or
            ``'soft++'``); a file of another variant is reported with a
            warning. Default: None.
        logger: ``print_log`` logger. Default: ``'current'``.

    Returns:
        dict: What the converter recognised (``convert_weights``), or the
        file's ``meta`` entry (may be empty).

    Raises:
        ValueError: A checkpoint that does not fit the model (see
            :func:`load_strictly` and ``soft_official_to_mmsoft``).
    """
    checkpoint, state_dict = read_pretrained(filename, prefix, map_location)
    if convert_weights:
        with naming_file(filename):
            state_dict, info = soft_official_to_mmsoft(
                checkpoint if not prefix else state_dict,
                name_hint=osp.basename(filename))
        print_log(f'converted reference SOFT checkpoint {filename}: '
                  f'variant={info["variant"]} ({info["variant_source"]}), '
                  f'{info["num_tensors"]} tensors.', logger=logger)
    else:
        state_dict = strip_prefixes(state_dict)
        meta = checkpoint.get('meta')
        info = dict(meta) if isinstance(meta, Mapping) else {}
    file_variant = info.get('variant')
    if isinstance(file_variant, str) and file_variant != variant:
        print_log(f'{filename} holds {file_variant!r} weights but the backbone '
                  f'computes variant={variant!r}.', logger=logger,
                  level=logging.WARNING)
    resize = None
    if pos_embed_grids:
        if resize_pos_embed is None:
            raise ValueError('pos_embed_grids needs resize_pos_embed, the model\'s '
                             'resize of grid embeddings; got None.')
        resize = grid_pos_embed_resizer(pos_embed_grids, resize_pos_embed)
    load_strictly(model, state_dict, filename, logger=logger, note=RESIZE_NOTE,
                  resize=resize)
    return info


def load_ufo_vit_checkpoint(model: nn.Module, filename: str,
                            prefix: Optional[str] = None, map_location='cpu',
                            logger='current') -> StateDict:
    """Loads a backbone checkpoint into a :class:`UFOViT`, strictly.

    Args:
        model (nn.Module): The backbone.
        filename (str): Path or URL: a file written by
            ``tools/model_converters/ufo_vit_cls2backbone.py``, any state
            dict of ``UFOViT`` (plain, under ``state_dict``/``model``, keys
            possibly prefixed with ``module.`` / ``backbone.``), or a
            detector/segmentor checkpoint with ``prefix='backbone.'``.
        prefix (str, optional): Load only the entries under this prefix.
            Default: None.
        map_location: As for ``torch.load``. Default: ``'cpu'``.
        logger: ``print_log`` logger. Default: ``'current'``.

    Returns:
        dict: The loaded state dict (optional keys: the model's values).

    Raises:
        ValueError: Missing keys other than the stride-4/8 resampling
            branches, unexpected keys or mis-shaped tensors, all listed.
    """
    _, state_dict = read_pretrained(filename, prefix, map_location)
    result = load_strictly(
        model, strip_prefixes(state_dict), filename, optional=ufo_vit_optional_key,
        logger=logger)
    if result.optional_missing:
        print_log(f'{filename}: {len(result.optional_missing)} tensors not in the '
                  f'checkpoint keep their initial values: '
                  f'{key_list(result.optional_missing)}.', logger=logger)
    return result.fitted
