"""``test(args)``: what ``tools/test.py`` runs, and its options."""
import argparse
import os.path as osp
from typing import Optional

from mmengine.config import Config

from mmsoft.checkpoint import check_checkpoint_fits

from .checkpoints import require_checkpoint
from .config import library_of, load_config, set_work_dir
from .data_paths import check_dataset_paths
from .distributed import setup_cpu_distributed
from .runner import build_runner


def enable_visualization(cfg: Config, library: str, show_dir: str) -> None:
    """``--show-dir``: the visualization hook paints every test image into
    ``show_dir``.

    Raises:
        ValueError: The config has no ``default_hooks.visualization``.
    """
    hooks = cfg.get('default_hooks') or {}
    if 'visualization' not in hooks:
        raise ValueError('--show-dir needs default_hooks.visualization (the '
                         "library's VisualizationHook) in the config")
    hooks['visualization']['draw'] = True
    hooks['visualization']['interval'] = 1
    if library == 'mmdet':
        # An absolute path: DetVisualizationHook joins it to work_dir/timestamp.
        hooks['visualization']['test_out_dir'] = show_dir
    else:
        cfg.visualizer['save_dir'] = show_dir


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


def test(args: argparse.Namespace) -> dict:
    """Builds the runner, checks the checkpoint and runs the test loop.

    Args:
        args (argparse.Namespace): The options of ``tools/test.py``:
            ``config``, ``checkpoint``, ``work_dir``, ``out``, ``show_dir``,
            ``cfg_options`` and ``launcher``.

    Returns:
        dict: The metrics.
    """
    cfg = load_config(args.config, args.cfg_options)
    library = library_of(cfg, args.config)
    cfg.launcher = args.launcher
    set_work_dir(cfg, args)
    check_dataset_paths(cfg, ('test', ), args.config)
    require_checkpoint(args.checkpoint)
    cfg.load_from = args.checkpoint
    show_dir = osp.abspath(args.show_dir) if args.show_dir else None
    if show_dir:
        enable_visualization(cfg, library, show_dir)
    if args.out:
        set_output(cfg, library, args.out)

    setup_cpu_distributed(cfg)
    runner = build_runner(cfg, args.config)
    check_checkpoint_fits(args.checkpoint, runner.model, args.config)
    if args.out and library == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(
            DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    print_metrics(metrics, show_dir)
    return metrics
