"""``test(args)``: what ``tools/test.py`` runs, and its options."""
import argparse
import os.path as osp
from typing import Optional

import torch.nn as nn
from mmengine.config import Config

from mmsoft.checkpoint import check_checkpoint_fits

from .checkpoints import require_checkpoint
from .config import library_of, load_config, set_work_dir
from .data_paths import check_dataset_paths
from .distributed import setup_cpu_distributed
from .runner import build_runner
from .tta import enable_tta
from .visualization import DEFAULT_WAIT_TIME, enable_visualization


def set_output(cfg: Config, library: str, out: str) -> None:
    """``--out``: keeps the raw predictions, a pickle (mmdet) or label maps
    (mmseg).

    Raises:
        ValueError: An mmdet ``out`` that is not a ``.pkl``/``.pickle`` file.
    """
    if library == 'mmdet':
        if not out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out must be a .pkl or .pickle file for mmdet '
                             f'configs, got {out}')
        return  # DumpDetResults is appended to the built evaluator.
    cfg.test_evaluator['output_dir'] = out
    cfg.test_evaluator['keep_results'] = True


def print_metrics(metrics: dict, show_dir: Optional[str]) -> None:
    """Prints ``metrics`` as a two-column table (rank 0 only)."""
    from mmengine.dist import get_rank
    if get_rank() != 0:
        return
    width = max([len(k) for k in metrics] + [6])
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    for key, value in metrics.items():
        text = f'{value:.4f}' if isinstance(value, float) else str(value)
        lines.append(f'{key:<{width}}  {text}')
    print('\n'.join(lines), flush=True)
    if show_dir:
        print(f'painted predictions: {show_dir}', flush=True)


def innermost_model(model: nn.Module) -> nn.Module:
    """The model inside its wrappers (DDP, a TTA model, or both)."""
    while hasattr(model, 'module'):
        model = model.module
    return model


def apply_test_options(cfg: Config, library: str,
                       args: argparse.Namespace) -> Optional[str]:
    """Applies the options of ``tools/test.py`` to ``cfg``: launcher, work
    directory, checkpoint, ``--show``/``--show-dir``, ``--tta`` and ``--out``
    (in mmdet's and mmseg's order).

    Returns:
        str or None: The absolute ``--show-dir``.
    """
    cfg.launcher = args.launcher
    set_work_dir(cfg, args)
    cfg.load_from = args.checkpoint
    show = getattr(args, 'show', False)
    show_dir = osp.abspath(args.show_dir) if args.show_dir else None
    if show or show_dir:
        enable_visualization(cfg, library, show_dir, show,
                             getattr(args, 'wait_time', DEFAULT_WAIT_TIME))
    if getattr(args, 'tta', False):
        enable_tta(cfg, library, args.config)
    if args.out:
        set_output(cfg, library, args.out)
    return show_dir


def test(args: argparse.Namespace) -> dict:
    """Builds the runner, checks the checkpoint and runs the test loop.

    Args:
        args (argparse.Namespace): The options of ``tools/test.py``:
            ``config``, ``checkpoint``, ``work_dir``, ``out``, ``show_dir``,
            ``show``, ``wait_time``, ``tta``, ``cfg_options`` and
            ``launcher`` (``show``, ``wait_time`` and ``tta`` may be absent:
            off, 2 s).

    Returns:
        dict: The metrics.
    """
    cfg = load_config(args.config, args.cfg_options)
    library = library_of(cfg, args.config)
    check_dataset_paths(cfg, ('test', ), args.config)
    require_checkpoint(args.checkpoint)
    show_dir = apply_test_options(cfg, library, args)

    setup_cpu_distributed(cfg)
    runner = build_runner(cfg, args.config)
    check_checkpoint_fits(args.checkpoint, innermost_model(runner.model),
                          args.config)
    if args.out and library == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(
            DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    print_metrics(metrics, show_dir)
    return metrics
