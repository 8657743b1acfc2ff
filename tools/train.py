"""Train a detector (mmdet) or segmentor (mmseg) from a config.

The library is chosen from the config's ``default_scope`` (``'mmdet'`` or
``'mmseg'``); options follow mmdet's and mmseg's ``tools/train.py``::

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--cfg-options k=v ...] [--launcher none|pytorch|slurm]

mmsoft's backbones are registered by the config itself
(``custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)``),
exactly as with mmdet's and mmseg's own tools, so a config that trains here
trains there too. Before the runner is built, the dataset paths of the config
are checked and a missing data root or annotation file is reported by name.
A model type missing from the registry is reported with the hint to import
mmsoft. Checkpoints are loaded with ``torch.load(weights_only=True)``; the few
globals of mmengine checkpoints are allow-listed by
:mod:`mmsoft.checkpoint.safe_load`.

``--resume`` without a path resumes from the latest checkpoint in the work
directory (if any); with a path, from that checkpoint. The iteration and
epoch counters, optimizer, parameter schedulers and message hub continue from
the checkpoint.
"""
import argparse
import os
import os.path as osp
import re
import sys
from typing import Iterator, List, Optional, Tuple

# The repository root, so that ``custom_imports=['mmsoft']`` resolves also
# without an installed package.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.logging import print_log  # noqa: E402

from mmsoft.checkpoint.model_fit import check_checkpoint_fits  # noqa: E402

#: Libraries the tools run, by ``default_scope``.
LIBRARIES = ('mmdet', 'mmseg', 'mmengine')
#: Model types that exist only once mmsoft is imported.
MMSOFT_TYPES = ('SOFT', 'UFOViT')
IMPORT_HINT = ("add custom_imports = dict(imports=['mmsoft'], "
               'allow_failed_imports=False) to the config')
_REGISTRY_MISS = re.compile(r"(\w+) is not in the ([\w:.]+) registry")


def parse_with_launcher(parser: argparse.ArgumentParser,
                        argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Adds ``--launcher``/``--local-rank``, parses, and exports ``LOCAL_RANK``.

    Shared by ``train.py`` and ``test.py``; torchrun sets ``LOCAL_RANK``
    itself, the older ``torch.distributed.launch`` passes ``--local-rank``.
    """
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments (mmdet's and mmseg's ``train.py`` options)."""
    parser = argparse.ArgumentParser(
        description='Train a detector or a segmentor (mmdet / mmseg config).')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from the given checkpoint, or, without a value, from the '
        'latest checkpoint in the work directory')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (needs a CUDA device)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the total batch size')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, e.g. train_cfg.max_epochs=2 '
        "'optim_wrapper.optimizer.lr=1e-4'; lists as key=\"[a,b]\"")
    return parse_with_launcher(parser, argv)


# --------------------------------------------------------------- config ---
def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Reads a config (its ``custom_imports`` get imported) and applies overrides.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The config's ``default_scope`` is not mmdet or mmseg.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    library_of(cfg, path)
    return cfg


def library_of(cfg: Config, path: str = '') -> str:
    """``'mmdet'``, ``'mmseg'`` or ``'mmengine'`` (plain mmengine configs such
    as UFO-ViT's ImageNet pretraining), from ``cfg.default_scope``."""
    scope = cfg.get('default_scope')
    if scope not in LIBRARIES:
        raise ValueError(
            f"config {path} has default_scope={scope!r}; these tools run mmdet "
            f"('mmdet'), mmseg ('mmseg') and plain mmengine ('mmengine') configs. "
            f'Inherit an mmdet:: or mmseg:: base config or set default_scope.')
    return scope


def default_work_dir(config_path: str) -> str:
    """``./work_dirs/<config name>``, as in mmdet and mmseg."""
    return osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def set_work_dir(cfg: Config, args: argparse.Namespace) -> None:
    """``--work-dir`` > the config's ``work_dir`` > ``./work_dirs/<name>``."""
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = default_work_dir(args.config)


# ------------------------------------------------------------ data paths ---
def _leaf_datasets(dataset, where: str) -> Iterator[Tuple[dict, str]]:
    """Dataset configs with files, looking through dataset wrappers."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):  # RepeatDataset & co.
        yield from _leaf_datasets(dataset['dataset'], f'{where}.dataset')
    elif isinstance(dataset.get('datasets'), (list, tuple)):  # ConcatDataset
        for i, sub in enumerate(dataset['datasets']):
            yield from _leaf_datasets(sub, f'{where}.datasets[{i}]')
    else:
        yield dataset, where


def _is_remote(path: str) -> bool:
    return '://' in path


def check_dataset_paths(cfg: Config, splits: Tuple[str, ...], config_path: str
                        ) -> None:
    """Checks that the data root, annotation files and image folders exist.

    Args:
        cfg (Config): The config.
        splits (tuple[str]): Dataloaders to check, e.g. ``('train', 'val')``.
        config_path (str): Named in the messages.

    Raises:
        FileNotFoundError: Naming the missing path, the config key it comes
            from, and how to create the demo data.
    """
    hint = ('generate the demo data with `python tools/generate_demo_data.py` or '
            'point data_root at the dataset (--cfg-options '
            '<split>_dataloader.dataset.data_root=PATH)')
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, where in _leaf_datasets(loader['dataset'],
                                             f'{split}_dataloader.dataset'):
            root = dataset.get('data_root') or ''
            if root and not _is_remote(root) and not osp.isdir(root):
                raise FileNotFoundError(
                    f'data root not found: {root} ({where}.data_root in '
                    f'{config_path}); {hint}')
            ann_file = dataset.get('ann_file') or ''
            if ann_file and not _is_remote(ann_file):
                path = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
                if not osp.isfile(path):
                    raise FileNotFoundError(
                        f'annotation file not found: {path} ({where}.ann_file in '
                        f'{config_path}); {hint}')
            prefixes = dataset.get('data_prefix') or {}
            for key, prefix in prefixes.items():
                if not isinstance(prefix, str) or not prefix or _is_remote(prefix):
                    continue
                path = prefix if osp.isabs(prefix) else osp.join(root, prefix)
                if not osp.isdir(path):
                    raise FileNotFoundError(
                        f'data folder not found: {path} ({where}.data_prefix.{key} '
                        f'in {config_path}); {hint}')


# --------------------------------------------------------------- runner ---
def build_runner(cfg: Config, config_path: str):
    """Builds the library's runner; registry misses get the mmsoft hint.

    Raises:
        KeyError: A type is missing from the registry; the message is the
            registry's, followed by the hint to import mmsoft.
    """
    library = library_of(cfg, config_path)
    try:
        if 'runner_type' in cfg:
            registry = __import__(f'{library}.registry', fromlist=['RUNNERS'])
            return registry.RUNNERS.build(cfg)
        from mmengine.runner import Runner
        return Runner.from_cfg(cfg)
    except KeyError as exc:
        message = exc.args[0] if exc.args else str(exc)
        match = _REGISTRY_MISS.search(str(message))
        if match is None:
            raise
        name = match.group(1)
        imports = (cfg.get('custom_imports') or {}).get('imports', [])
        if name in MMSOFT_TYPES:
            hint = (f'{name} is an mmsoft backbone and the config does not import '
                    f'mmsoft (custom_imports: {imports or "none"}); {IMPORT_HINT} '
                    f'{config_path}')
        else:
            hint = (f'if {name} comes from mmsoft or another plugin, {IMPORT_HINT} '
                    f'{config_path} (custom_imports: {imports or "none"})')
        raise KeyError(f'{message}\nHint: {hint}') from exc


def setup_cpu_distributed(cfg: Config) -> None:
    """Prepares a distributed run on a machine without CUDA (e.g. gloo).

    mmengine 0.10's ``pytorch`` launcher calls ``torch.cuda.set_device`` and
    wraps the model in ``DistributedDataParallel`` with ``device_ids``; both
    fail on a CPU-only torch. Here the process group is initialised from
    torchrun's environment (mmengine then skips its own initialisation) and
    the model is wrapped without device ids.

    Raises:
        RuntimeError: A launcher other than ``pytorch`` without CUDA.
    """
    import torch
    import torch.distributed as torch_dist
    if cfg.launcher == 'none' or torch.cuda.is_available():
        return
    if cfg.launcher != 'pytorch':
        raise RuntimeError(f'--launcher {cfg.launcher} needs CUDA devices; on CPU '
                           f'use torchrun (tools/dist_train.sh, --launcher pytorch)')
    dist_cfg = dict((cfg.get('env_cfg') or {}).get('dist_cfg') or {})
    backend = dist_cfg.pop('backend', 'gloo')
    if backend != 'gloo':
        print_log(f"dist backend '{backend}' needs CUDA; using 'gloo' on CPU",
                  logger='current')
        backend = 'gloo'
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend=backend, **dist_cfg)
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    if wrapper.get('type', 'MMDistributedDataParallel') == \
            'MMDistributedDataParallel':
        wrapper['type'] = _cpu_ddp_type()
        wrapper.setdefault('broadcast_buffers', False)
        wrapper.setdefault('find_unused_parameters',
                           cfg.get('find_unused_parameters', False))
        cfg.model_wrapper_cfg = wrapper


def _cpu_ddp_type() -> str:
    """Registers (once) and names mmengine's DDP wrapper without device ids."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.registry import MODEL_WRAPPERS
    name = 'CPUDistributedDataParallel'
    if MODEL_WRAPPERS.get(name) is None:

        class CPUDistributedDataParallel(MMDistributedDataParallel):
            """``MMDistributedDataParallel`` for CPU modules (no device ids)."""

            def __init__(self, module, device_ids=None, **kwargs):
                super().__init__(module=module, device_ids=None, **kwargs)

        MODEL_WRAPPERS.register_module(name=name,
                                       module=CPUDistributedDataParallel)
    return name


def activate_checkpoint_allow_list() -> None:
    """Allow-lists mmengine checkpoint globals for ``weights_only`` loading.

    Importing mmsoft does it; the tools call this after the runner is built,
    so that model registration still comes only from the config.
    """
    from mmsoft.checkpoint import allow_mmengine_checkpoint_globals
    allow_mmengine_checkpoint_globals()


# ----------------------------------------------------------------- main ---
def configure(cfg: Config, args: argparse.Namespace) -> None:
    """Applies the command-line options to ``cfg`` (as mmdet's train.py)."""
    cfg.launcher = args.launcher
    set_work_dir(cfg, args)
    if args.amp:
        from mmengine.device import (is_cuda_available, is_mlu_available,
                                     is_npu_available)
        if not (is_cuda_available() or is_npu_available() or is_mlu_available()):
            raise RuntimeError('--amp needs a CUDA, NPU or MLU device: mmengine\'s '
                               'AmpOptimWrapper does not run on CPU')
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'AmpOptimWrapper':
            print_log('AMP training is already enabled in the config.',
                      logger='current')
        elif wrapper != 'OptimWrapper':
            raise ValueError(f'--amp replaces OptimWrapper by AmpOptimWrapper; the '
                             f'config uses {wrapper}')
        else:
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        scale = cfg.get('auto_scale_lr')
        if not scale or 'base_batch_size' not in scale:
            raise ValueError('--auto-scale-lr needs auto_scale_lr = dict('
                             'enable=False, base_batch_size=N) in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'checkpoint file not found: {args.resume} '
                                    f'(--resume)')
        cfg.resume = True
        cfg.load_from = args.resume


def resume_checkpoint(cfg: Config) -> Optional[str]:
    """The checkpoint a resuming run will load, if any."""
    if not cfg.get('resume'):
        return cfg.get('load_from')
    if cfg.get('load_from'):
        return cfg.load_from
    from mmengine.runner import find_latest_checkpoint
    return find_latest_checkpoint(cfg.work_dir)


def main(argv: Optional[List[str]] = None) -> None:
    """Builds the runner from the config and options, then trains."""
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    configure(cfg, args)
    val_splits = ('val', ) if cfg.get('val_cfg') else ()
    check_dataset_paths(cfg, ('train', ) + val_splits, args.config)
    if library_of(cfg) == 'mmdet':
        from mmdet.utils import setup_cache_size_limit_of_dynamo
        setup_cache_size_limit_of_dynamo()
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg, args.config)
    activate_checkpoint_allow_list()
    checkpoint = resume_checkpoint(cfg)
    if checkpoint:
        check_checkpoint_fits(checkpoint, runner.model, args.config)
    runner.train()


if __name__ == '__main__':
    main()
