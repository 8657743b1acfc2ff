"""Checks that the dataset files a config names exist, before a run starts."""
import os.path as osp
from typing import Iterator, Tuple

from mmengine.config import Config

#: How to get data, appended to every message.
DATA_HINT = ('generate the demo data with `python tools/generate_demo_data.py` or '
             'point data_root at the dataset (--cfg-options '
             '<split>_dataloader.dataset.data_root=PATH)')


def leaf_datasets(dataset, where: str) -> Iterator[Tuple[dict, str]]:
    """Dataset configs with files, looking through dataset wrappers.

    Args:
        dataset (dict): A dataset config, possibly a wrapper.
        where (str): Its config key, e.g. ``'train_dataloader.dataset'``.

    Yields:
        tuple[dict, str]: Each wrapped dataset config and its config key.
    """
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):  # RepeatDataset & co.
        yield from leaf_datasets(dataset['dataset'], f'{where}.dataset')
    elif isinstance(dataset.get('datasets'), (list, tuple)):  # ConcatDataset
        for i, sub in enumerate(dataset['datasets']):
            yield from leaf_datasets(sub, f'{where}.datasets[{i}]')
    else:
        yield dataset, where


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL (``s3://``, ``http://``...), not checked."""
    return '://' in path


def check_dataset_files(dataset: dict, where: str, config_path: str) -> None:
    """Checks the data root, annotation file and data folders of one dataset.

    Raises:
        FileNotFoundError: Naming the missing path, the config key ``where``
            it comes from, ``config_path`` and how to create the demo data.
    """
    root = dataset.get('data_root') or ''
    if root and not is_remote(root) and not osp.isdir(root):
        raise FileNotFoundError(f'data root not found: {root} ({where}.data_root '
                                f'in {config_path}); {DATA_HINT}')
    ann_file = dataset.get('ann_file') or ''
    if ann_file and not is_remote(ann_file):
        path = osp.join(root, ann_file)  # an absolute ann_file stays as is
        if not osp.isfile(path):
            raise FileNotFoundError(
                f'annotation file not found: {path} ({where}.ann_file in '
                f'{config_path}); {DATA_HINT}')
    for key, prefix in (dataset.get('data_prefix') or {}).items():
        if not isinstance(prefix, str) or not prefix or is_remote(prefix):
            continue
        path = osp.join(root, prefix)
        if not osp.isdir(path):
            raise FileNotFoundError(
                f'data folder not found: {path} ({where}.data_prefix.{key} in '
                f'{config_path}); {DATA_HINT}')


def check_dataset_paths(cfg: Config, splits: Tuple[str, ...], config_path: str
                        ) -> None:
    """Checks that the data roots, annotation files and image folders exist.

    Args:
        cfg (Config): The config.
        splits (tuple[str]): Dataloaders to check, e.g. ``('train', 'val')``.
        config_path (str): Named in the messages.

    Raises:
        FileNotFoundError: Naming the missing path, the config key it comes
            from, and how to create the demo data.
    """
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, where in leaf_datasets(loader['dataset'],
                                            f'{split}_dataloader.dataset'):
            check_dataset_files(dataset, where, config_path)
