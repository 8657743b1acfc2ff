"""Models built in a config's scope, and the runner with what mmengine
lacks: the hint to import mmsoft, and distributed runs without CUDA."""
import copy
import importlib
import re

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import DefaultScope

from .checks import LIBRARIES, library_of

IMPORT_HINT = ("add custom_imports = dict(imports=['mmsoft'], "
               'allow_failed_imports=False) to the config')
CPU_DDP_TYPE = 'CPUDistributedDataParallel'


def build_in_scope(scope: str, model_cfg: dict, pretrained: bool = True) -> nn.Module:
    """Builds ``model_cfg`` from the ``MODELS`` of the library ``scope``;
    ``pretrained=False`` drops the backbone's ``init_cfg``."""
    if scope not in LIBRARIES:
        raise ValueError(f'scope={scope!r} is not supported; expected one of '
                         f'{list(LIBRARIES)}.')
    if scope != 'mmengine':
        importlib.import_module(f'{scope}.utils').register_all_modules(
            init_default_scope=False)
    if not pretrained and 'backbone' in model_cfg:
        model_cfg = copy.deepcopy(model_cfg)
        model_cfg['backbone']['init_cfg'] = None
    with DefaultScope.overwrite_default_scope(scope):
        return importlib.import_module(f'{scope}.registry').MODELS.build(model_cfg)


def build_model_from_config(cfg: Config) -> nn.Module:
    """``cfg.model`` in its scope, without pretrained weights, in eval mode."""
    return build_in_scope(library_of(cfg, cfg.filename or ''), cfg.model,
                          pretrained=False).eval()


def config_types(node):
    """Every ``type`` name in a nested config."""
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            yield node['type']
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        for value in node:
            yield from config_types(value)


def check_imports_mmsoft(cfg: Config, config_path: str) -> None:
    """A ``KeyError`` names an mmsoft type of the model when the config does
    not import mmsoft: the libraries' own tools would not find it."""
    from mmengine.registry import MODELS
    imports = list((cfg.get('custom_imports') or {}).get('imports', []))
    if any(name.split('.')[0] == 'mmsoft' for name in imports):
        return
    backbones = 'mmsoft.openmmlab.backbones'
    kinds = {name: 'backbone' if cls.__module__ == backbones else 'model'
             for name, cls in MODELS.module_dict.items()
             if cls.__module__.split('.')[0] == 'mmsoft'}
    used = sorted((name for name in config_types(cfg.get('model')) if name in kinds),
                  key=lambda name: kinds[name] != 'backbone')
    if used:
        name = used[0]
        raise KeyError(
            f'{name} is not in the {library_of(cfg, config_path)}::model registry '
            f'unless mmsoft is imported\nHint: {name} is an mmsoft {kinds[name]} and '
            f'the config does not import mmsoft (custom_imports: {imports or "none"}); '
            f'{IMPORT_HINT} {config_path}')


def build_runner(cfg: Config, config_path: str):
    """The library's runner; a type missing from a registry gets the hint to
    import the plugin."""
    from mmengine.runner import Runner
    check_imports_mmsoft(cfg, config_path)
    registry = importlib.import_module(f'{library_of(cfg, config_path)}.registry')
    try:
        if 'runner_type' in cfg:
            return registry.RUNNERS.build(cfg)
        return Runner.from_cfg(cfg)
    except KeyError as exc:
        message = str(exc.args[0] if exc.args else exc)
        missing = re.search(r'(\w+) is not in the [\w:.]+ registry', message)
        if missing is None:
            raise
        imports = (cfg.get('custom_imports') or {}).get('imports') or 'none'
        raise KeyError(f'{message}\nHint: if {missing.group(1)} comes from mmsoft or '
                       f'another plugin, {IMPORT_HINT} {config_path} (custom_imports: '
                       f'{imports})') from exc


def setup_cpu_distributed(cfg: Config) -> None:
    """Without CUDA: starts gloo from torchrun's environment and gives DDP no
    device ids, which mmengine 0.10's ``pytorch`` launcher does. Other
    launchers raise a ``RuntimeError``."""
    if cfg.launcher == 'none' or torch.cuda.is_available():
        return
    if cfg.launcher != 'pytorch':
        raise RuntimeError(f'--launcher {cfg.launcher} needs CUDA devices; on CPU '
                           f'use torchrun (tools/dist_train.sh, --launcher pytorch)')
    dist_cfg = dict((cfg.get('env_cfg') or {}).get('dist_cfg') or {})
    backend = dist_cfg.pop('backend', 'gloo')
    if backend != 'gloo':
        print_log(f"no CUDA: the gloo backend instead of the config's '{backend}'",
                  logger='current')
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend='gloo', **dist_cfg)
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    if wrapper.get('type', 'MMDistributedDataParallel') == 'MMDistributedDataParallel':
        wrapper['type'] = register_cpu_ddp()
        wrapper.setdefault('broadcast_buffers', False)
        wrapper.setdefault('find_unused_parameters',
                           cfg.get('find_unused_parameters', False))
        cfg.model_wrapper_cfg = wrapper


def register_cpu_ddp() -> str:
    """Registers once, and names, mmengine's DDP wrapper without device ids."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.registry import MODEL_WRAPPERS
    if MODEL_WRAPPERS.get(CPU_DDP_TYPE) is None:

        class CPUDistributedDataParallel(MMDistributedDataParallel):

            def __init__(self, module, device_ids=None, **kwargs):
                super().__init__(module=module, device_ids=None, **kwargs)

        MODEL_WRAPPERS.register_module(name=CPU_DDP_TYPE,
                                       module=CPUDistributedDataParallel)
    return CPU_DDP_TYPE
