"""Run set-up: reading a config and applying the command-line options to it."""
import argparse
import os.path as osp
from typing import Optional

from mmengine.config import Config, DictAction
from mmengine.logging import print_log

from ..utils.sizes import parse_size  # noqa: F401 (re-exported)
from .checkpoints import require_checkpoint

#: Libraries the tools run, by ``default_scope``.
LIBRARIES = ('mmdet', 'mmseg', 'mmengine')


def add_cfg_options(parser: argparse.ArgumentParser,
                    example: str = 'model.backbone.drop_path_rate=0.2') -> None:
    """Adds the OpenMMLab tools' ``--cfg-options KEY=VALUE ...`` override.

    Args:
        parser (ArgumentParser): The tool's parser.
        example (str): An override shown in the help.
    """
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help=f'override config settings, e.g. {example}; lists as key="[a,b]"')


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Reads a config (its ``custom_imports`` get imported) and applies overrides.

    Args:
        path (str): The config file.
        cfg_options (dict, optional): ``--cfg-options`` overrides. Default: None.

    Returns:
        Config: The config, with the overrides merged in.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The config's ``default_scope`` is not one of
            :data:`LIBRARIES`.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    library_of(cfg, path)
    return cfg


def library_of(cfg: Config, path: str = '') -> str:
    """``'mmdet'``, ``'mmseg'`` or ``'mmengine'`` (plain mmengine configs),
    from ``cfg.default_scope``. UFO-ViT's ImageNet pre-training configs are
    mmpretrain's and run with mmpretrain's own tools.

    Raises:
        ValueError: ``default_scope`` is not one of :data:`LIBRARIES`; the
            message names the config ``path``.
    """
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


def enable_amp(cfg: Config) -> None:
    """``--amp``: replaces ``OptimWrapper`` by ``AmpOptimWrapper``.

    Raises:
        RuntimeError: No CUDA, NPU or MLU device.
        ValueError: The config's optimizer wrapper is neither ``OptimWrapper``
            nor ``AmpOptimWrapper``.
    """
    from mmengine.device import (is_cuda_available, is_mlu_available,
                                 is_npu_available)
    if not (is_cuda_available() or is_npu_available() or is_mlu_available()):
        raise RuntimeError('--amp needs a CUDA, NPU or MLU device: mmengine\'s '
                           'AmpOptimWrapper does not run on CPU (the backbones '
                           'do run under torch.autocast there, see '
                           'tests/test_mixed_precision.py)')
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


def enable_auto_scale_lr(cfg: Config) -> None:
    """``--auto-scale-lr``: sets ``auto_scale_lr.enable``.

    Raises:
        ValueError: The config has no ``auto_scale_lr.base_batch_size``.
    """
    scale = cfg.get('auto_scale_lr')
    if not scale or 'base_batch_size' not in scale:
        raise ValueError('--auto-scale-lr needs auto_scale_lr = dict('
                         'enable=False, base_batch_size=N) in the config')
    cfg.auto_scale_lr.enable = True


def set_resume(cfg: Config, resume: Optional[str]) -> None:
    """``--resume``: ``'auto'`` resumes from the latest checkpoint of the work
    directory, a path from that checkpoint; ``None`` leaves ``cfg`` as is.

    Raises:
        FileNotFoundError: ``resume`` names a file that does not exist.
    """
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        require_checkpoint(resume, '--resume')
        cfg.resume = True
        cfg.load_from = resume


def apply_train_options(cfg: Config, args: argparse.Namespace) -> None:
    """Applies the options of ``tools/train.py`` to ``cfg`` (as mmdet's
    ``train.py``): launcher, work directory, ``--amp``, ``--auto-scale-lr``
    and ``--resume``."""
    cfg.launcher = args.launcher
    set_work_dir(cfg, args)
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        enable_auto_scale_lr(cfg)
    set_resume(cfg, args.resume)
