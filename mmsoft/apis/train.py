"""``train(args)``: what ``tools/train.py`` runs."""
import argparse

from mmsoft.checkpoint import check_checkpoint_fits

from .checkpoints import resume_checkpoint
from .config import apply_train_options, library_of, load_config
from .data_paths import check_dataset_paths
from .distributed import setup_cpu_distributed
from .runner import build_runner


def train(args: argparse.Namespace) -> None:
    """Builds the runner from the config and the options, then trains.

    The dataset paths are checked before the runner is built; the checkpoint
    a resumed run loads is checked against the model before training.

    Args:
        args (argparse.Namespace): The options of ``tools/train.py``:
            ``config``, ``work_dir``, ``resume``, ``amp``, ``auto_scale_lr``,
            ``cfg_options`` and ``launcher``.
    """
    cfg = load_config(args.config, args.cfg_options)
    apply_train_options(cfg, args)
    val_splits = ('val', ) if cfg.get('val_cfg') else ()
    check_dataset_paths(cfg, ('train', ) + val_splits, args.config)
    if library_of(cfg) == 'mmdet':
        from mmdet.utils import setup_cache_size_limit_of_dynamo
        setup_cache_size_limit_of_dynamo()
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg, args.config)
    checkpoint = resume_checkpoint(cfg)
    if checkpoint:
        check_checkpoint_fits(checkpoint, runner.model, args.config)
    runner.train()
