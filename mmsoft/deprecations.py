"""Deprecated spellings, old name -> new name, and how they still load.

Each old spelling keeps working with a ``DeprecationWarning`` naming the new
one: constructor arguments (:data:`RENAMED_ARGUMENTS`), keys of an ``arch``
dict (:data:`RENAMED_ARCH_KEYS`), solver names (:data:`RENAMED_SOLVERS`) and
state-dict keys (:data:`RENAMED_STATE_DICT_KEYS`).
"""
import functools
import re
import warnings
from typing import Callable, Dict, List, Mapping, Optional, Tuple

#: Constructor arguments: class name -> {old: new}.
RENAMED_ARGUMENTS = {
    'SOFT': {'attention': 'variant', 'recompute_ffn': 'recompute_mlp'},
    'UFOViT': {'recompute_ffn': 'recompute_mlp'},
}
#: Keys of an ``arch`` dict: class name -> {old: new}.
RENAMED_ARCH_KEYS = {'UFOViT': {'lpi_kernel_size': 'local_kernel_size'}}
#: Solver names of SOFT attention: old -> new.
RENAMED_SOLVERS = {'cholesky': 'exact'}
#: Argument values: class name -> {argument: {old value: new value}}.
RENAMED_VALUES = {'SOFT': {'solver': RENAMED_SOLVERS},
                  'SoftAttention': {'solver': RENAMED_SOLVERS}}
#: State-dict keys: class name -> [(old key pattern, new key template)], in order.
#: ``.ffn.`` became ``.mlp.``; SOFT's four lists became one module per stage.
RENAMED_STATE_DICT_KEYS = {
    'SOFT': [(r'(^|\.)ffn\.', r'\1mlp.'),
             (r'^patch_embeds\.(\d+)\.', r'stages.\1.patch_embed.'),
             (r'^pos_embeds\.(\d+)$', r'stages.\1.pos_embed'),
             (r'^stages\.(\d+)\.(\d+)\.', r'stages.\1.blocks.\2.'),
             (r'^cls_token$', 'stages.3.cls_token'),
             (r'^norm\.', 'stages.3.norm.')],
    'UFOViT': [(r'(^|\.)ffn\.', r'\1mlp.')],
}
_KEY_RULES = {name: [(re.compile(old), new) for old, new in rules]
              for name, rules in RENAMED_STATE_DICT_KEYS.items()}


def warn_renamed(old: str, new: str, stacklevel: int) -> None:
    """Warns that ``old`` is deprecated and now spelled ``new``."""
    warnings.warn(f'{old} is deprecated: it is now spelled {new}.', DeprecationWarning,
                  stacklevel=stacklevel + 1)


def _init_frames_above(instance: object, init: Callable) -> int:
    """``__init__`` frames between a caller and ``init``: the subclasses of
    ``instance`` above ``init``'s class that define their own ``__init__``."""
    frames = 0
    for cls in type(instance).__mro__:
        if cls.__dict__.get('__init__') is init:
            return frames
        frames += '__init__' in cls.__dict__
    return 0


def accepts_renamed_arguments(init: Callable) -> Callable:
    """Decorator of ``__init__``: old argument names (:data:`RENAMED_ARGUMENTS`)
    and values (:data:`RENAMED_VALUES`) of the class are accepted as keywords,
    each with a warning at the caller's line.

    Raises:
        TypeError: Both spellings of one argument given.
    """
    class_name = init.__qualname__.split('.')[0]
    renames = RENAMED_ARGUMENTS.get(class_name, {})
    value_renames = RENAMED_VALUES.get(class_name, {})

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        stacklevel = 2 + _init_frames_above(self, wrapper)
        for old, new in renames.items():
            if old not in kwargs:
                continue
            if new in kwargs:
                raise TypeError(f'{type(self).__name__} got {old}= and {new}=; '
                                f'{old}= is the deprecated spelling of {new}=.')
            warn_renamed(f'{type(self).__name__}({old}=...)', f'{new}=', stacklevel)
            kwargs[new] = kwargs.pop(old)
        for name, values in value_renames.items():
            value = kwargs.get(name)
            if isinstance(value, str) and value in values:
                warn_renamed(f'{name}={value!r}', f'{name}={values[value]!r}',
                             stacklevel)
                kwargs[name] = values[value]
        if class_name in RENAMED_ARCH_KEYS:
            args, kwargs = _with_renamed_arch_keys(class_name, args, kwargs, stacklevel)
        return init(self, *args, **kwargs)

    return wrapper


def _with_renamed_arch_keys(class_name: str, args: tuple, kwargs: dict,
                            stacklevel: int) -> Tuple[tuple, dict]:
    """``args`` and ``kwargs`` with old keys of the ``arch`` dict (the first
    argument) renamed (:data:`RENAMED_ARCH_KEYS`), warning.

    Raises:
        ValueError: Both spellings of one key given.
    """
    arch = kwargs.get('arch', args[0] if args else None)
    if not isinstance(arch, Mapping):
        return args, kwargs
    arch = dict(arch)
    for old, new in RENAMED_ARCH_KEYS[class_name].items():
        if old not in arch:
            continue
        if new in arch:
            raise ValueError(f'got {old!r} and {new!r}; {old!r} is the deprecated '
                             f'spelling of {new!r}.')
        warn_renamed(f'arch[{old!r}]', f'arch[{new!r}]', stacklevel + 1)
        arch[new] = arch.pop(old)
    if 'arch' in kwargs:
        return args, dict(kwargs, arch=arch)
    return (arch, ) + tuple(args[1:]), kwargs


def renamed_solver(solver: str, stacklevel: int = 2) -> str:
    """The current name of ``solver`` (:data:`RENAMED_SOLVERS`), warning if old;
    ``stacklevel`` 2 names the line that called the caller."""
    if solver not in RENAMED_SOLVERS:
        return solver
    warn_renamed(f'solver={solver!r}', f'solver={RENAMED_SOLVERS[solver]!r}',
                 stacklevel + 1)
    return RENAMED_SOLVERS[solver]


def renamed_state_dict_keys(state_dict: Mapping,
                            class_name: Optional[str]) -> Tuple[dict, List[str]]:
    """Old keys of ``class_name``'s state dict under their new names.

    Returns:
        The renamed dict (order kept) and the old keys that were renamed.
    """
    rules = _KEY_RULES.get(class_name, [])
    renamed, old_keys = {}, []
    for key, value in state_dict.items():
        new = key
        for pattern, template in rules:
            new = pattern.sub(template, new)
        renamed[new] = value
        if new != key:
            old_keys.append(key)
    return renamed, old_keys


def rename_deprecated_keys(state_dict: Mapping, class_name: Optional[str],
                           stacklevel: int = 2) -> Dict:
    """:func:`renamed_state_dict_keys`, warning once (old -> new) if any key was old."""
    renamed, old_keys = renamed_state_dict_keys(state_dict, class_name)
    if old_keys:
        pairs = renamed_state_dict_keys({key: None for key in old_keys[:3]},
                                        class_name)[0]
        shown = ', '.join(f'{old!r} is now {new!r}'
                          for old, new in zip(old_keys[:3], pairs))
        more = f' and {len(old_keys) - 3} more' if len(old_keys) > 3 else ''
        warnings.warn(f'checkpoint keys use deprecated names ({shown}{more}); loaded '
                      f'under the new names.', DeprecationWarning,
                      stacklevel=stacklevel + 1)
    return renamed
