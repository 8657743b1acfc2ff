"""The checkpoint a run loads: which file, and that it exists."""
import os.path as osp
from typing import Optional

from mmengine.config import Config


def require_checkpoint(path: str, option: str = '') -> None:
    """Raises unless the checkpoint file ``path`` exists.

    Args:
        path (str): The checkpoint file.
        option (str): The command-line option that named it, e.g.
            ``'--resume'``; named in the message. Default: ''.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    if not osp.isfile(path):
        source = f' ({option})' if option else ''
        raise FileNotFoundError(f'checkpoint file not found: {path}{source}')


def resume_checkpoint(cfg: Config) -> Optional[str]:
    """The checkpoint a training run will load, if any: ``load_from``, or
    with ``resume`` and no ``load_from`` the latest one of ``work_dir``."""
    if not cfg.get('resume'):
        return cfg.get('load_from')
    if cfg.get('load_from'):
        return cfg.load_from
    from mmengine.runner import find_latest_checkpoint
    return find_latest_checkpoint(cfg.work_dir)
