"""Building in a config's registry scope: the runner and models.

mmsoft's backbones are registered in mmengine's root ``MODELS``, where the
mmdet, mmseg and mmengine scopes all find them once mmsoft is imported. A
config run by the libraries' own tools must import mmsoft itself
(``custom_imports``); :func:`build_runner` reports a config that does not.
"""
import copy
import importlib
import re
from typing import Dict, Iterator, List, Optional

import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import DefaultScope, Registry

from ..checkpoint.safe_load import allow_mmengine_checkpoint_globals

from .config import LIBRARIES, library_of

IMPORT_HINT = ("add custom_imports = dict(imports=['mmsoft'], "
               'allow_failed_imports=False) to the config')
_REGISTRY_MISS = re.compile(r"(\w+) is not in the ([\w:.]+) registry")


def library_registry(scope: str, name: str) -> Registry:
    """The registry ``name`` (e.g. ``'MODELS'``) of the library ``scope``.

    Raises:
        ValueError: ``scope`` is not one of :data:`~.config.LIBRARIES`.
    """
    if scope not in LIBRARIES:
        raise ValueError(f'scope={scope!r} is not supported; expected one of '
                         f'{list(LIBRARIES)}.')
    return getattr(importlib.import_module(f'{scope}.registry'), name)


def build_in_scope(scope: str, model_cfg: dict,
                   pretrained: bool = True) -> nn.Module:
    """Builds a model from the registry of ``scope``, with that default scope.

    The library's modules are registered first (without setting the default
    scope of the process).

    Args:
        scope (str): ``'mmdet'``, ``'mmseg'`` or ``'mmengine'``, usually the
            config's ``default_scope``.
        model_cfg (dict): The model config, e.g. ``cfg.model``; not changed.
        pretrained (bool): Keep the backbone's ``init_cfg`` (its pretrained
            checkpoint); ``False`` builds the backbone without it. Default: True.

    Returns:
        nn.Module: The model (weights not initialised by ``init_weights``).
    """
    registry = library_registry(scope, 'MODELS')
    if scope != 'mmengine':
        utils = importlib.import_module(f'{scope}.utils')
        utils.register_all_modules(init_default_scope=False)
    if not pretrained and 'backbone' in model_cfg:
        model_cfg = copy.deepcopy(model_cfg)
        model_cfg['backbone']['init_cfg'] = None
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(model_cfg)


def build_model_from_config(cfg: Config) -> nn.Module:
    """Builds ``cfg.model`` in the config's scope, without pretrained weights.

    Args:
        cfg (Config): An mmdet or mmseg config (its ``custom_imports``
            already imported, as ``Config.fromfile`` does).

    Returns:
        nn.Module: The model in eval mode (weights not initialised by
        ``init_weights``).

    Raises:
        ValueError: ``cfg.default_scope`` is not one of
            :data:`~.config.LIBRARIES`.
    """
    scope = library_of(cfg, cfg.filename or '')
    return build_in_scope(scope, cfg.model, pretrained=False).eval()


def config_types(node) -> Iterator[str]:
    """Every ``type`` name in a (nested) config dict or list."""
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            yield node['type']
        for value in node.values():
            yield from config_types(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from config_types(value)


def mmsoft_model_types() -> Dict[str, str]:
    """The model types that mmsoft registers, with what each is
    (``'backbone'``, or ``'model'`` for the data preprocessors)."""
    from mmengine.registry import MODELS
    backbones = 'mmsoft.openmmlab.backbones'
    return {name: 'backbone' if cls.__module__ == backbones else 'model'
            for name, cls in MODELS.module_dict.items()
            if cls.__module__.split('.')[0] == 'mmsoft'}


def imported_modules(cfg: Config) -> List[str]:
    """The modules of the config's ``custom_imports``."""
    return list((cfg.get('custom_imports') or {}).get('imports', []))


def check_imports_mmsoft(cfg: Config, config_path: str) -> None:
    """Raises if the model uses an mmsoft type but the config does not import
    mmsoft: mmdet's and mmseg's own tools would not find the type.

    Raises:
        KeyError: Naming the type, the registry it is missing from without
            mmsoft, the config's ``custom_imports`` and the fix.
    """
    imports = imported_modules(cfg)
    if any(name.split('.')[0] == 'mmsoft' for name in imports):
        return
    kinds = mmsoft_model_types()
    # The backbone first: it is what a reader of the config looks for.
    used = sorted((name for name in config_types(cfg.get('model')) if name in kinds),
                  key=lambda name: kinds[name] != 'backbone')
    if used:
        name, scope = used[0], library_of(cfg, config_path)
        raise KeyError(
            f'{name} is not in the {scope}::model registry unless mmsoft is '
            f'imported\nHint: {name} is an mmsoft {kinds[name]} and the config does '
            f'not import mmsoft (custom_imports: {imports or "none"}); '
            f'{IMPORT_HINT} {config_path}')


def registry_hint(message: str, cfg: Config, config_path: str) -> Optional[str]:
    """The hint for a registry's "X is not in the Y registry" ``message``, or
    None for another message."""
    match = _REGISTRY_MISS.search(message)
    if match is None:
        return None
    imports = imported_modules(cfg)
    return (f'if {match.group(1)} comes from mmsoft or another plugin, '
            f'{IMPORT_HINT} {config_path} (custom_imports: {imports or "none"})')


def build_runner(cfg: Config, config_path: str):
    """Builds the library's runner; registry misses get the import hint.

    Args:
        cfg (Config): The config, options applied.
        config_path (str): Named in the messages.

    Returns:
        Runner: The runner of ``cfg.runner_type`` (from the library's
        ``RUNNERS``), or mmengine's ``Runner``.

    Raises:
        KeyError: The model uses an mmsoft type and the config does not
            import mmsoft; or a type is missing from a registry: the message
            is the registry's, followed by the hint to import the plugin.
    """
    library = library_of(cfg, config_path)
    check_imports_mmsoft(cfg, config_path)
    # The runner's --resume and load_from read mmengine checkpoints.
    allow_mmengine_checkpoint_globals()
    try:
        if 'runner_type' in cfg:
            return library_registry(library, 'RUNNERS').build(cfg)
        from mmengine.runner import Runner
        return Runner.from_cfg(cfg)
    except KeyError as exc:
        message = str(exc.args[0] if exc.args else exc)
        hint = registry_hint(message, cfg, config_path)
        if hint is None:
            raise
        raise KeyError(f'{message}\nHint: {hint}') from exc
