"""The checks ``tools/train.py`` and ``tools/test.py`` run before mmdet's or
mmseg's runner starts."""
import os.path as osp
from typing import Iterator, Optional, Tuple

from mmengine.config import Config

from ..checkpoint import check_checkpoint_fits

#: The libraries the tools run, by ``default_scope``.
LIBRARIES = ('mmdet', 'mmseg', 'mmengine')
#: How to get data, appended to every missing-data message.
DATA_HINT = ('generate the demo data with `python tools/generate_demo_data.py` or '
             'point data_root at the dataset (--cfg-options '
             '<split>_dataloader.dataset.data_root=PATH)')


def library_of(cfg: Config, path: str = '') -> str:
    """The config's ``default_scope`` if it is one of :data:`LIBRARIES`, else a
    ``ValueError`` naming the config ``path``."""
    scope = cfg.get('default_scope')
    if scope not in LIBRARIES:
        raise ValueError(
            f"config {path} has default_scope={scope!r}; these tools run mmdet "
            f"('mmdet'), mmseg ('mmseg') and plain mmengine ('mmengine') configs. "
            f'Inherit an mmdet:: or mmseg:: base config or set default_scope.')
    return scope


def load_config(args) -> Config:
    """The config of a tool's command line, set up as mmdet's and mmseg's tools
    do (``--cfg-options``, the launcher, the work directory: the command line,
    the config, then ``./work_dirs/<config name>``), its library checked.

    Raises:
        FileNotFoundError: No config file.
    """
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file not found: {args.config}')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    library_of(cfg, args.config)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        name = osp.splitext(osp.basename(args.config))[0]
        cfg.work_dir = osp.join('./work_dirs', name)
    return cfg


def leaf_datasets(dataset, where: str) -> Iterator[Tuple[dict, str]]:
    """Each dataset config inside ``dataset``'s wrappers, with its config key."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):  # RepeatDataset & co.
        yield from leaf_datasets(dataset['dataset'], f'{where}.dataset')
    elif isinstance(dataset.get('datasets'), (list, tuple)):  # ConcatDataset
        for i, sub in enumerate(dataset['datasets']):
            yield from leaf_datasets(sub, f'{where}.datasets[{i}]')
    else:
        yield dataset, where


def check_dataset_paths(cfg: Config, splits: Tuple[str, ...], config_path: str) -> None:
    """Raises a ``FileNotFoundError`` naming a missing data root, annotation
    file or data folder of the ``splits`` dataloaders, and its config key."""
    for split in splits:
        loader = cfg.get(f'{split}_dataloader') or {}
        for dataset, where in leaf_datasets(loader.get('dataset'),
                                            f'{split}_dataloader.dataset'):
            root = dataset.get('data_root') or ''
            paths = [(root, osp.isdir, 'data root', 'data_root')]
            if dataset.get('ann_file'):
                paths.append((osp.join(root, dataset['ann_file']), osp.isfile,
                              'annotation file', 'ann_file'))
            prefixes = (dataset.get('data_prefix') or {}).items()
            paths += [(osp.join(root, prefix), osp.isdir, 'data folder',
                       f'data_prefix.{key}')
                      for key, prefix in prefixes if isinstance(prefix, str) and prefix]
            for path, exists, what, key in paths:
                if path and '://' not in path and not exists(path):
                    raise FileNotFoundError(f'{what} not found: {path} ({where}.{key} '
                                            f'in {config_path}); {DATA_HINT}')


def require_checkpoint(path: str, option: str = '') -> None:
    """Raises ``FileNotFoundError`` unless ``path`` is a file (named with the
    ``option`` that gave it)."""
    if not osp.isfile(path):
        source = f' ({option})' if option else ''
        raise FileNotFoundError(f'checkpoint file not found: {path}{source}')


def check_resumed_checkpoint(cfg: Config, model, config_path: str) -> Optional[str]:
    """Checks the checkpoint a training run loads (``load_from``, or with
    ``resume`` the latest in ``work_dir``) against ``model``; returns it."""
    path = cfg.get('load_from')
    if cfg.get('resume') and not path:
        from mmengine.runner import find_latest_checkpoint
        path = find_latest_checkpoint(cfg.work_dir)
    if path:
        check_checkpoint_fits(path, model, config_path)
    return path


def check_amp(cfg: Config) -> None:
    """``--amp``: mmengine's ``AmpOptimWrapper`` needs a CUDA, NPU or MLU device
    (``RuntimeError``) and replaces an ``OptimWrapper`` (``ValueError``)."""
    from mmengine.device import is_cuda_available, is_mlu_available, is_npu_available
    if not (is_cuda_available() or is_npu_available() or is_mlu_available()):
        raise RuntimeError('--amp needs a CUDA, NPU or MLU device: mmengine\'s '
                           'AmpOptimWrapper does not run on CPU (the backbones '
                           'do run under torch.autocast there, see '
                           'tests/test_mixed_precision.py)')
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise ValueError(f'--amp replaces OptimWrapper by AmpOptimWrapper; the '
                         f'config uses {wrapper}')


def check_tta(cfg: Config, library: str, config_path: str) -> None:
    """``--tta`` needs ``tta_model`` and ``tta_pipeline``; mmdet's
    ``DetTTAModel`` merges boxes, not masks. A ``ValueError`` names what fails."""
    if library not in ('mmdet', 'mmseg'):
        raise ValueError(f'--tta is for mmdet and mmseg configs; {config_path} '
                         f"has default_scope='{library}'")
    missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
    if missing:
        raise ValueError(f'--tta needs {" and ".join(missing)} in the config '
                         f"{config_path} (mmseg's bases define them: tta_model in "
                         '_base_/default_runtime.py, tta_pipeline in '
                         '_base_/datasets/*.py)')
    roi_head = cfg.model.get('roi_head') or {}
    if cfg.tta_model.get('type') == 'DetTTAModel' and roi_head.get('mask_head'):
        raise ValueError(
            f"--tta: mmdet's DetTTAModel merges boxes only and the model of "
            f'{config_path} predicts masks (model.roi_head.mask_head). Test without '
            '--tta, or test the boxes alone, e.g. for Mask R-CNN: --cfg-options '
            'model.roi_head.mask_roi_extractor=None model.roi_head.mask_head=None '
            'test_evaluator.metric=bbox')


def check_show(wait_time: float) -> None:
    """Checks ``--wait-time``; warns when ``--show`` cannot open a window."""
    import warnings

    import matplotlib
    from matplotlib.backends import BackendFilter, backend_registry  # >= 3.9
    if wait_time < 0:
        raise ValueError(f'--wait-time must be >= 0 seconds (0: wait for a key '
                         f'press), got {wait_time}')
    backend = matplotlib.get_backend()
    names = backend_registry.list_builtin(BackendFilter.NON_INTERACTIVE)
    if backend.lower() not in {name.lower() for name in names}:
        return
    if wait_time == 0:
        raise ValueError(
            f"--show --wait-time 0 waits for a key press in a window, but "
            f"matplotlib's backend '{backend}' opens none (no display?): set "
            'MPLBACKEND to an interactive backend (e.g. TkAgg) on a machine '
            'with a display, or use --show-dir DIR to keep the painted images')
    warnings.warn(
        f"--show: matplotlib's backend '{backend}' cannot open windows (no "
        f'display?); the painted predictions are drawn but not shown, each '
        f'after {wait_time} s, as with mmdet\'s and mmseg\'s tools. Use '
        '--show-dir DIR to keep them as files.')
