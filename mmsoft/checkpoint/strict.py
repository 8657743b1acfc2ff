"""Strict comparison of a checkpoint's state dict with a model's: every
difference is listed by name. ``optional`` keys may be missing; a ``resize``
hook may fit position embeddings learned at another image size."""
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

StateDict = Dict[str, torch.Tensor]
#: ``resize(key, checkpoint_tensor, model_tensor)``: the checkpoint's tensor in
#: the model's shape, or None.
ResizeHook = Callable[[str, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]
#: BatchNorm's update counters: not weights, tolerated when missing.
BN_COUNTER_KEYS = re.compile(r'(.+\.)?num_batches_tracked')
#: Leading prefixes of wrapped models (DDP, a detector's backbone), in any order.
WRAPPER_PREFIXES = re.compile(r'^((module|backbone)\.)+')


def key_list(keys: Iterable, limit: Optional[int] = 40) -> str:
    """Sorted, comma-separated keys, then a count past ``limit``; ``'-'`` for none."""
    keys = sorted(map(str, keys))
    text = ', '.join(keys[:limit])
    if limit is not None and len(keys) > limit:
        text += f', ... ({len(keys) - limit} more)'
    return text or '-'


def unwrap_state_dict(checkpoint: Mapping) -> Tuple[Mapping, Optional[str]]:
    """The state dict of a checkpoint and its entry: ``'state_dict'``,
    ``'model'`` or None (bare). Raises a ``ValueError`` for a non-mapping."""
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f'a checkpoint must be a mapping (a state dict or a dict '
                         f'holding one); got {type(checkpoint).__name__}.')
    for wrapper in ('state_dict', 'model'):
        if isinstance(checkpoint.get(wrapper), Mapping):
            return checkpoint[wrapper], wrapper
    return checkpoint, None


def strip_prefixes(state_dict: Mapping, pattern: re.Pattern = WRAPPER_PREFIXES) -> dict:
    """``state_dict`` with ``pattern`` removed from its keys, as mmengine's
    ``revise_keys``."""
    return {pattern.sub('', str(key)): value for key, value in state_dict.items()}


def split_prefix(state_dict: Mapping, prefix: str) -> Tuple[dict, list]:
    """The entries under ``prefix`` (prefix removed; ``module.`` ignored) and
    the other keys."""
    pattern = re.compile(rf'^(module\.)?{re.escape(prefix.rstrip("."))}\.')
    selected, others = {}, []
    for key, value in state_dict.items():
        if pattern.match(str(key)):
            selected[pattern.sub('', str(key))] = value
        else:
            others.append(key)
    return selected, others


def select_prefix(state_dict: Mapping, prefix: str) -> dict:
    """The entries under ``prefix``; a ``ValueError`` when there are none."""
    selected, _ = split_prefix(state_dict, prefix)
    if not selected:
        groups = {str(key).split('.', 1)[0] + '.' for key in state_dict}
        raise ValueError(f'the checkpoint has no keys starting with {prefix!r}; '
                         f'its keys start with {key_list(groups, limit=10)}.')
    return selected


@dataclass
class StateDictComparison:
    """The ``fitted`` tensor of every model key, and the keys ``missing``,
    ``optional_missing``, ``unexpected``, ``mismatched`` and ``resized``."""
    fitted: StateDict = field(default_factory=dict)
    missing: List[str] = field(default_factory=list)
    optional_missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: Dict[str, Tuple[tuple, tuple]] = field(default_factory=dict)
    resized: Dict[str, Tuple[tuple, tuple]] = field(default_factory=dict)

    def fits(self, allow_unexpected: bool = False) -> bool:
        """Whether the checkpoint fills the model (and holds nothing else)."""
        return not (self.missing or self.mismatched
                    or (self.unexpected and not allow_unexpected))

    def describe(self, allow_unexpected: bool = False,
                 limit: Optional[int] = 40) -> str:
        """``'missing keys: a, b; shape mismatches: c: (5,) (expected (32,))'``."""
        shapes = [f'{key}: {src} (expected {dst})'
                  for key, (src, dst) in sorted(self.mismatched.items())]
        parts = [('missing keys', self.missing),
                 ('unexpected keys', [] if allow_unexpected else self.unexpected),
                 ('shape mismatches', shapes)]
        return '; '.join(f'{name}: {key_list(keys, limit)}'
                         for name, keys in parts if keys)


def compare_state_dict(state_dict: Mapping, model_state: Mapping,
                       optional: Optional[re.Pattern] = None,
                       resize: Optional[ResizeHook] = None) -> StateDictComparison:
    """Compares ``state_dict`` key by key and shape by shape with the model's."""
    result = StateDictComparison()
    result.unexpected = sorted(str(key) for key in state_dict if key not in model_state)
    for key, target in model_state.items():
        if key not in state_dict:
            is_optional = optional is not None and optional.fullmatch(key)
            (result.optional_missing if is_optional else result.missing).append(key)
            result.fitted[key] = target
            continue
        value = state_dict[key]
        if value.shape != target.shape and resize is not None:
            resized = resize(key, value, target)
            if resized is not None and resized.shape == target.shape:
                result.resized[key] = (tuple(value.shape), tuple(target.shape))
                value = resized
        if value.shape != target.shape:
            result.mismatched[key] = (tuple(value.shape), tuple(target.shape))
        result.fitted[key] = value
    result.missing.sort()
    result.optional_missing.sort()
    return result


def fit_state_dict(state_dict: Mapping, model_state: Mapping, context: str,
                   optional: Optional[re.Pattern] = None,
                   resize: Optional[ResizeHook] = None, allow_unexpected: bool = False,
                   note: str = '') -> StateDictComparison:
    """:func:`compare_state_dict`; a ``ValueError`` starting with ``context``
    lists every difference."""
    result = compare_state_dict(state_dict, model_state, optional, resize)
    if not result.fits(allow_unexpected):
        suffix = f' {note}' if note and result.mismatched else ''
        raise ValueError(f'{context}: {result.describe(allow_unexpected)}.{suffix}')
    return result


def grid_pos_embed_resizer(grids: Mapping, resize_grid: Callable) -> ResizeHook:
    """The resize hook of position embeddings (1, E + S * S, C): ``grids``
    maps a key to (the model's grid, E), ``resize_grid`` is the model's
    resize of a grid (1, Hs * Ws, C), (Hs, Ws), (H, W) -> (1, H * W, C)."""

    def resize(key: str, value: torch.Tensor, target: torch.Tensor):
        if key not in grids or value.dim() != 3 or value.shape[0] != 1 \
                or value.shape[2] != target.shape[2]:
            return None
        grid, extra = grids[key]
        side = math.isqrt(max(value.shape[1] - extra, 0))
        if side == 0 or side * side != value.shape[1] - extra:
            return None
        tokens = resize_grid(value[:, extra:].float(), (side, side), grid)
        return torch.cat((value[:, :extra], tokens.to(value.dtype)), dim=1)

    return resize
