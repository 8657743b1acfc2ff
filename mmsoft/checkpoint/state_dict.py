"""The state dict inside a checkpoint: unwrapping, key prefixes, key lists."""
from typing import Dict, Iterable, Mapping, Optional, Tuple

import torch

StateDict = Dict[str, torch.Tensor]

#: Checkpoint entries that hold the state dict, in order of preference:
#: mmengine and timm write ``state_dict``, DeiT-style scripts ``model``.
WRAPPER_KEYS = ('state_dict', 'model')
#: Leading key prefixes of wrapped models: DataParallel/DDP and the backbone
#: of a detector, segmentor or classifier.
WRAPPER_PREFIXES = ('module.', 'backbone.')


def unwrap_state_dict(checkpoint: Mapping) -> Tuple[Mapping, Optional[str]]:
    """The state dict inside ``checkpoint`` and the entry it came from.

    Args:
        checkpoint (Mapping): A loaded checkpoint: ``{'state_dict': ...}``,
            ``{'model': ...}`` or a bare state dict.

    Returns:
        tuple[Mapping, str | None]: The state dict and ``'state_dict'``,
        ``'model'`` or None (a bare state dict).

    Raises:
        ValueError: ``checkpoint`` is not a mapping.
    """
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f'a checkpoint must be a mapping (a state dict or a dict '
                         f'holding one); got {type(checkpoint).__name__}.')
    for wrapper in WRAPPER_KEYS:
        if isinstance(checkpoint.get(wrapper), Mapping):
            return checkpoint[wrapper], wrapper
    return checkpoint, None


def strip_key_prefixes(key: str, prefixes: Tuple[str, ...] = WRAPPER_PREFIXES
                       ) -> Tuple[str, str]:
    """Removes leading ``prefixes`` (repeatedly, in any order) from ``key``.

    Args:
        key (str): e.g. ``'module.backbone.stages.0.0.norm1.weight'``.
        prefixes (tuple[str]): Prefixes to remove. Default:
            :data:`WRAPPER_PREFIXES`.

    Returns:
        tuple[str, str]: The stripped key and what was removed
        (``'stages.0.0.norm1.weight'``, ``'module.backbone.'``).
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


def strip_prefixes(state_dict: Mapping,
                   prefixes: Tuple[str, ...] = WRAPPER_PREFIXES) -> StateDict:
    """``state_dict`` with :func:`strip_key_prefixes` applied to every key."""
    return {strip_key_prefixes(str(key), prefixes)[0]: value
            for key, value in state_dict.items()}


def split_prefix(state_dict: Mapping, prefix: str,
                 ignored: Tuple[str, ...] = ('module.', )) -> Tuple[dict, list]:
    """Splits ``state_dict`` into the entries under ``prefix`` and the rest.

    Args:
        state_dict (Mapping): Keys to split.
        prefix (str): e.g. ``'backbone.'``; a missing final dot is added.
        ignored (tuple[str]): Wrapper prefixes removed before looking for
            ``prefix``. Default: ``('module.',)``.

    Returns:
        tuple[dict, list[str]]: The entries under ``prefix`` (both prefixes
        removed from their keys) and the keys of the other entries.
    """
    if not prefix.endswith('.'):
        prefix += '.'
    selected, others = {}, []
    for key, value in state_dict.items():
        bare = strip_key_prefixes(str(key), ignored)[0]
        if bare.startswith(prefix):
            selected[bare[len(prefix):]] = value
        else:
            others.append(key)
    return selected, others


def select_prefix(state_dict: Mapping, prefix: str) -> dict:
    """The entries under ``prefix`` (e.g. ``'backbone.'``), prefix removed.

    Raises:
        ValueError: No key starts with ``prefix``.
    """
    selected, _ = split_prefix(state_dict, prefix)
    if not selected:
        groups = {str(key).split('.', 1)[0] + '.' for key in state_dict}
        raise ValueError(f'the checkpoint has no keys starting with {prefix!r}; '
                         f'its keys start with {key_list(groups, limit=10)}.')
    return selected


def key_list(keys: Iterable, limit: Optional[int] = 40) -> str:
    """Sorted, comma-separated keys; past ``limit`` of them, a count.

    Args:
        keys (Iterable): Keys (or other strings).
        limit (int, optional): Most keys written out; None writes all.
            Default: 40.

    Returns:
        str: e.g. ``'a, b, ... (3 more)'``, or ``'-'`` for no keys.
    """
    keys = sorted(map(str, keys))
    text = ', '.join(keys[:limit])
    if limit is not None and len(keys) > limit:
        text += f', ... ({len(keys) - limit} more)'
    return text or '-'
