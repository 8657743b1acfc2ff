"""Argument checks: each raises a ``ValueError`` naming the argument, the
value and what is accepted."""
from typing import Iterable, Sequence, Tuple


def check_choice(name: str, value, choices: Iterable) -> None:
    """Raises unless ``value`` is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f'{name}={value!r} is not supported; expected one of '
                         f'{choices}.')


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    """Raises unless ``value`` is an int >= 1 (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = ' or None' if allow_none else ''
        raise ValueError(f'{name}={value!r} is invalid; expected an integer >= 1'
                         f'{extra}.')


def check_positive_float(name: str, value) -> None:
    """Raises unless ``value`` is a number > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f'{name}={value!r} is invalid; expected a positive float.')


def check_divisible(name: str, dims: Sequence[int], heads_name: str,
                    heads: Sequence[int]) -> None:
    """Raises unless every ``dims[i]`` is divisible by ``heads[i]``."""
    for i, (dim, head) in enumerate(zip(dims, heads)):
        if head < 1 or dim % head != 0:
            raise ValueError(
                f'{name}[{i}]={dim} is not divisible by {heads_name}[{i}]={head}; '
                f'the width must be a multiple of the number of heads.')


def check_lengths(arch: dict, keys: Sequence[str], length: int) -> None:
    """Raises unless each listed per-stage setting has ``length`` entries."""
    for key in keys:
        value = arch[key]
        if not isinstance(value, (list, tuple)) or len(value) != length:
            raise ValueError(f'arch[{key!r}]={value!r} must be a list of {length} '
                             f'values, one per stage.')


def check_out_indices(out_indices: Sequence[int], num_outputs: int) -> Tuple[int]:
    """``out_indices`` as sorted non-negative indices; negative ones count from
    the end, as in timm."""
    if isinstance(out_indices, int):
        out_indices = (out_indices, )
    out_indices = tuple(out_indices)
    if not out_indices or any(
            isinstance(i, bool) or not isinstance(i, int)
            or not -num_outputs <= i < num_outputs for i in out_indices):
        raise ValueError(f'out_indices={out_indices!r} is invalid; expected '
                         f'distinct integers in [{-num_outputs}, {num_outputs - 1}] '
                         f'(negative ones count from the end).')
    resolved = tuple(sorted(i % num_outputs for i in out_indices))
    if len(set(resolved)) != len(resolved):
        raise ValueError(f'out_indices={out_indices!r} names an output twice '
                         f'(resolved: {resolved}).')
    return resolved


def check_frozen_stages(frozen_stages: int, num_stages: int) -> None:
    """Raises unless ``-1 <= frozen_stages <= num_stages``."""
    if not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= num_stages:
        raise ValueError(f'frozen_stages={frozen_stages!r} is out of range; '
                         f'expected an integer in [-1, {num_stages}] '
                         f'(-1 freezes nothing).')


def check_mlp_ratio(name: str, ratio, embed_dims: int) -> None:
    """Raises unless ``ratio`` is a number with ``int(embed_dims * ratio) >= 1``."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
            int(embed_dims * ratio) < 1:
        raise ValueError(f'{name}={ratio!r} is invalid; expected a positive number '
                         f'with embed_dims * mlp_ratio >= 1.')


def check_rate(name: str, value: float) -> None:
    """Raises unless ``0 <= value < 1``."""
    if not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f'{name}={value!r} is invalid; expected a float in [0, 1).')


def resolve_arch(arch, arch_table: dict, required_keys: Sequence[str],
                 defaults: dict = None) -> dict:
    """A copy of ``arch_table[arch]``, or the dict ``arch`` checked for
    ``required_keys``, with ``defaults`` filled in."""
    settings = dict(defaults or {})
    if isinstance(arch, str):
        check_choice('arch', arch, arch_table)
        settings.update(arch_table[arch])
        return settings
    if not isinstance(arch, dict):
        raise ValueError(f'arch={arch!r} must be one of {list(arch_table)} or a '
                         f'dict with keys {list(required_keys)}.')
    missing = [k for k in required_keys if k not in arch]
    if missing:
        raise ValueError(f'arch dict {arch!r} lacks the keys {missing}; '
                         f'required: {list(required_keys)}.')
    settings.update(arch)
    unknown = set(settings) - set(required_keys) - set(defaults or {})
    if unknown:
        raise ValueError(f'arch dict has unknown keys {sorted(unknown)}; accepted: '
                         f'{sorted(set(required_keys) | set(defaults or {}))}.')
    return settings
