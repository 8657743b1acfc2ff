"""Evaluate a checkpoint of a detector (mmdet) or segmentor (mmseg).

The library is chosen from the config's ``default_scope``; options follow
mmdet's and mmseg's ``tools/test.py``::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE_OR_DIR]
        [--show-dir DIR] [--cfg-options k=v ...] [--launcher none|pytorch|slurm]

``--out``: mmdet: a ``.pkl`` file of the raw predictions; mmseg: a folder of
predicted label maps. ``--show-dir``: a folder for images painted with the
predictions by the library's visualizer (relative paths are taken from the
current directory). The metrics are logged and printed as a table at the end.

Before the runner is built, the test data paths are checked; after, the
checkpoint is loaded with ``weights_only=True`` and compared with the model, so
a truncated file, a file that is not a checkpoint or a checkpoint of another
model is reported by name with the reason.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from train import (activate_checkpoint_allow_list, build_runner,  # noqa: E402
                   check_checkpoint_fits, check_dataset_paths, library_of,
                   load_config, parse_with_launcher, set_work_dir,
                   setup_cpu_distributed)
from mmengine.config import Config, DictAction  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments (mmdet's and mmseg's ``test.py`` options)."""
    parser = argparse.ArgumentParser(
        description='Test (and evaluate) a detector or a segmentor checkpoint.')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and metrics')
    parser.add_argument(
        '--out', help='mmdet: .pkl file for the predictions; mmseg: folder for '
        'the predicted label maps')
    parser.add_argument('--show-dir',
                        help='folder for images painted with the predictions')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, e.g. test_dataloader.batch_size=2')
    return parse_with_launcher(parser, argv)


def enable_visualization(cfg: Config, library: str, show_dir: str) -> None:
    """Lets the visualization hook paint every test image into ``show_dir``."""
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
    """Keeps the raw predictions: a pickle (mmdet) or label maps (mmseg)."""
    if library == 'mmdet':
        if not out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out must be a .pkl or .pickle file for mmdet '
                             f'configs, got {out}')
        return  # DumpDetResults is appended to the built evaluator.
    cfg.test_evaluator['output_dir'] = out
    cfg.test_evaluator['keep_results'] = True


def main(argv: Optional[List[str]] = None) -> dict:
    """Builds the runner, checks the checkpoint and runs the test loop.

    Returns:
        dict: The metrics.
    """
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    library = library_of(cfg, args.config)
    cfg.launcher = args.launcher
    set_work_dir(cfg, args)
    check_dataset_paths(cfg, ('test', ), args.config)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    show_dir = osp.abspath(args.show_dir) if args.show_dir else None
    if show_dir:
        enable_visualization(cfg, library, show_dir)
    if args.out:
        set_output(cfg, library, args.out)

    setup_cpu_distributed(cfg)
    runner = build_runner(cfg, args.config)
    activate_checkpoint_allow_list()
    check_checkpoint_fits(args.checkpoint, runner.model, args.config)
    if args.out and library == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(
            DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    print_metrics(metrics, show_dir)
    return metrics


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


if __name__ == '__main__':
    main()
