"""Train a detector (mmdet) or a segmentor (mmseg) from a config.

mmdet's and mmseg's ``tools/train.py``, with mmsoft's checks before the run
(:mod:`mmsoft.apis`).
"""
import argparse
import os
import os.path as osp
import sys

from mmengine.config import DictAction

# The checkout, for ``custom_imports=['mmsoft']`` without an installed mmsoft.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

from mmsoft import apis  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a detector or a segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', default=False,
        help='enable automatic-mixed-precision training (needs a CUDA device)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='enable automatically scaling LR.')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from the given checkpoint, or without one from the latest '
        'checkpoint in the work directory')
    add_run_arguments(parser, 'train_cfg.max_epochs=2 '
                      '"optim_wrapper.optimizer.lr=1e-4"')
    return parse_run_arguments(parser, argv)


def add_run_arguments(parser, example):
    """The options that tools/train.py and tools/test.py share."""
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help=f'override settings of the config, e.g. {example}; lists as key="[a,b]"')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_run_arguments(parser, argv):
    """The parsed arguments, ``LOCAL_RANK`` set from ``--local-rank``."""
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_runner(cfg, config_path):
    """mmsoft's runner of ``cfg``, set up as mmdet's and mmseg's tools do."""
    if cfg.default_scope == 'mmdet':
        # Fewer repeated compilations (mmdet's tool does this too).
        from mmdet.utils import setup_cache_size_limit_of_dynamo
        setup_cache_size_limit_of_dynamo()

    apis.setup_cpu_distributed(cfg)
    return apis.build_runner(cfg, config_path)


def setup_config(args):
    """The config with the options applied, as mmdet's tool sets it up."""
    cfg = apis.load_config(args)
    if args.amp:
        apis.check_amp(cfg)
        cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic')

    if args.auto_scale_lr:
        if 'base_batch_size' not in (cfg.get('auto_scale_lr') or {}):
            raise ValueError('--auto-scale-lr needs auto_scale_lr = dict(enable=False, '
                             'base_batch_size=N) in the config')
        cfg.auto_scale_lr.enable = True

    if args.resume is not None:
        if args.resume != 'auto':
            apis.require_checkpoint(args.resume, '--resume')
        cfg.resume = True
        cfg.load_from = None if args.resume == 'auto' else args.resume
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = setup_config(args)
    splits = ('train', 'val') if cfg.get('val_cfg') else ('train', )
    apis.check_dataset_paths(cfg, splits, args.config)
    runner = build_runner(cfg, args.config)
    apis.check_resumed_checkpoint(cfg, runner.model, args.config)
    runner.train()


if __name__ == '__main__':
    main()
