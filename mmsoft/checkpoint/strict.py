"""Strict comparison of a checkpoint's state dict with a model's.

Every key of the model must be in the checkpoint with the model's shape and
every key of the checkpoint must be in the model; what differs is listed by
name. Two loosenings are explicit arguments: ``optional`` keys may be missing
(the model keeps its own values for them), and a ``resize`` hook may turn a
mis-shaped tensor into one of the model's shape (position embeddings learned
at another image size, see :mod:`.pos_embed`).
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from .state_dict import StateDict, key_list

#: ``resize(key, checkpoint_tensor, model_tensor)``: the checkpoint tensor in
#: the model tensor's shape, or None when it cannot be resized.
ResizeHook = Callable[[str, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]
#: Keys allowed to be missing: a pattern matched against the whole key, or a
#: predicate.
OptionalKeys = Union[str, re.Pattern, Callable[[str], bool], None]
#: BatchNorm's update counters: not weights, tolerated when missing.
BN_COUNTER_KEYS = re.compile(r'(.+\.)?num_batches_tracked')


@dataclass
class StateDictComparison:
    """What :func:`compare_state_dict` found.

    Attributes:
        fitted (dict[str, Tensor]): One tensor per model key: the
            checkpoint's (resized where the hook did), or the model's own for
            a missing key.
        missing (list[str]): Model keys absent from the checkpoint and not
            optional, sorted.
        optional_missing (list[str]): Optional model keys absent from the
            checkpoint (left to the model's values), sorted.
        unexpected (list[str]): Checkpoint keys the model does not have,
            sorted.
        mismatched (dict[str, tuple]): Key -> (checkpoint shape, model shape)
            of tensors whose shapes differ (after resizing).
        resized (dict[str, tuple]): Key -> (checkpoint shape, model shape) of
            tensors the resize hook adapted.
    """
    fitted: StateDict = field(default_factory=dict)
    missing: List[str] = field(default_factory=list)
    optional_missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: Dict[str, Tuple[tuple, tuple]] = field(default_factory=dict)
    resized: Dict[str, Tuple[tuple, tuple]] = field(default_factory=dict)

    def fits(self, allow_unexpected: bool = False) -> bool:
        """Whether the checkpoint fills every required tensor of the model
        (and has nothing else, unless ``allow_unexpected``)."""
        return not (self.missing or self.mismatched
                    or (self.unexpected and not allow_unexpected))

    def describe(self, allow_unexpected: bool = False,
                 limit: Optional[int] = 40) -> str:
        """The differences, e.g. ``'missing keys: a, b; shape mismatches:
        c: (5,) (expected (32,))'``; empty when the checkpoint fits.

        Args:
            allow_unexpected (bool): Leave unexpected keys out. Default: False.
            limit (int, optional): Most keys listed per kind (then a count);
                None lists all. Default: 40.
        """
        parts = []
        if self.missing:
            parts.append(f'missing keys: {key_list(self.missing, limit)}')
        if self.unexpected and not allow_unexpected:
            parts.append(f'unexpected keys: {key_list(self.unexpected, limit)}')
        if self.mismatched:
            shapes = [f'{key}: {src} (expected {dst})'
                      for key, (src, dst) in sorted(self.mismatched.items())]
            parts.append(f'shape mismatches: {key_list(shapes, limit)}')
        return '; '.join(parts)


def _optional_predicate(optional: OptionalKeys) -> Callable[[str], bool]:
    """``optional`` as a predicate over keys."""
    if optional is None:
        return lambda key: False
    if callable(optional) and not isinstance(optional, re.Pattern):
        return optional
    pattern = re.compile(optional)
    return lambda key: pattern.fullmatch(key) is not None


def compare_state_dict(state_dict: Mapping, model_state: Mapping,
                       optional: OptionalKeys = None,
                       resize: Optional[ResizeHook] = None) -> StateDictComparison:
    """Compares ``state_dict`` key by key and shape by shape with a model's.

    Args:
        state_dict (Mapping): The checkpoint's tensors (model key layout).
        model_state (Mapping): ``model.state_dict()``.
        optional (str | re.Pattern | Callable, optional): Model keys allowed
            to be missing (see :data:`OptionalKeys`). Default: None.
        resize (Callable, optional): Hook trying to adapt a tensor whose
            shape differs from the model's (see :data:`ResizeHook`).
            Default: None.

    Returns:
        StateDictComparison: The fitted tensors and every difference.
    """
    is_optional = _optional_predicate(optional)
    result = StateDictComparison()
    result.unexpected = sorted(str(key) for key in state_dict
                               if key not in model_state)
    for key, target in model_state.items():
        if key not in state_dict:
            missing = result.optional_missing if is_optional(key) else result.missing
            missing.append(key)
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
                   optional: OptionalKeys = None, resize: Optional[ResizeHook] = None,
                   allow_unexpected: bool = False, note: str = ''
                   ) -> StateDictComparison:
    """:func:`compare_state_dict`, raising when the checkpoint does not fit.

    Args:
        state_dict, model_state, optional, resize: See
            :func:`compare_state_dict`.
        context (str): Start of the error message, e.g. ``'checkpoint x.pth
            does not fit the SOFT backbone'``.
        allow_unexpected (bool): Checkpoint keys the model lacks are ignored
            (e.g. the heads of a detector). Default: False.
        note (str): Appended to the message when shapes differ (e.g. what the
            resize hook accepts). Default: ``''``.

    Returns:
        StateDictComparison: Its ``fitted`` tensors load with
        ``model.load_state_dict(..., strict=True)``.

    Raises:
        ValueError: ``'{context}: missing keys: ...; unexpected keys: ...;
            shape mismatches: key: (checkpoint shape) (expected (model
            shape)), ...'`` listing every difference by name.
    """
    result = compare_state_dict(state_dict, model_state, optional, resize)
    if not result.fits(allow_unexpected):
        suffix = f' {note}' if note and result.mismatched else ''
        raise ValueError(f'{context}: {result.describe(allow_unexpected)}.{suffix}')
    return result
