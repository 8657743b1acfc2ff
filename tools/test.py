"""Test (and evaluate) a checkpoint of a detector (mmdet) or a segmentor (mmseg).

mmdet's and mmseg's ``tools/test.py``, with mmsoft's checks before the run
(:mod:`mmsoft.apis`); the metrics are printed as a table at the end.
"""
import argparse
import os.path as osp
import warnings
from copy import deepcopy

from mmengine.config import ConfigDict

from train import add_run_arguments, apis, build_runner, parse_run_arguments
from mmsoft.checkpoint import check_checkpoint_fits


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Test (and evaluate) a detector or a segmentor checkpoint')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and metrics')
    parser.add_argument('--out', help='mmdet: .pkl file for the predictions; '
                        'mmseg: folder for the predicted label maps')
    parser.add_argument('--show', action='store_true',
                        help='show each painted prediction in a window')
    parser.add_argument('--show-dir', help='folder for images painted with the '
                        'predictions')
    parser.add_argument('--wait-time', type=float, default=2,
                        help='seconds each --show window stays (0: until a key press)')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation (the config's tta_model and "
                        'tta_pipeline)')
    add_run_arguments(parser, 'test_dataloader.batch_size=2')
    return parse_run_arguments(parser, argv)


def trigger_visualization_hook(cfg, args):
    """Paints every test image: in a window (``--show``), into ``--show-dir``."""
    if 'visualization' not in cfg.get('default_hooks', {}):
        options = [name for name, on in (('--show-dir', args.show_dir),
                                         ('--show', args.show)) if on]
        raise ValueError(f'{" and ".join(options)} needs default_hooks.visualization '
                         "(the library's VisualizationHook) in the config")
    hook = cfg.default_hooks.visualization
    hook.update(draw=True, interval=1)
    if args.show:
        apis.check_show(args.wait_time)
        hook.update(show=True, wait_time=args.wait_time)
    if args.show_dir and cfg.default_scope == 'mmdet':
        # An absolute path: mmdet's hook joins a relative one to work_dir/timestamp.
        hook['test_out_dir'] = osp.abspath(args.show_dir)
    elif args.show_dir:
        cfg.visualizer['save_dir'] = osp.abspath(args.show_dir)


def enable_tta(cfg, config_path):
    """The model inside ``tta_model`` and the test images through
    ``tta_pipeline``; an mmdet config without them gets mmdet's defaults."""
    mmdet = cfg.get('default_scope') == 'mmdet'
    if mmdet and 'tta_model' not in cfg:
        warnings.warn('Cannot find ``tta_model`` in config, we will set it as '
                      'default (DetTTAModel, NMS at IoU 0.5).')
        cfg.tta_model = dict(type='DetTTAModel', tta_cfg=dict(
            nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
    if mmdet and 'tta_pipeline' not in cfg:
        warnings.warn('Cannot find ``tta_pipeline`` in config, we will set it as '
                      'default (the test pipeline with and without a flip).')
        test_data_cfg, _ = next(apis.leaf_datasets(cfg.test_dataloader.dataset, 'test'))
        cfg.tta_pipeline = deepcopy(test_data_cfg.pipeline)
        cfg.tta_pipeline[-1] = dict(type='TestTimeAug', transforms=[
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='PackDetInputs',
                  meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                             'scale_factor', 'flip', 'flip_direction'))]])
    apis.check_tta(cfg, cfg.get('default_scope'), config_path)
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    for dataset, _ in apis.leaf_datasets(cfg.test_dataloader.dataset, 'test'):
        dataset['pipeline'] = deepcopy(cfg.tta_pipeline)


def setup_config(args):
    """The config with the options applied, as mmdet's and mmseg's tools set it up."""
    cfg = apis.load_config(args)
    library = cfg.default_scope
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        trigger_visualization_hook(cfg, args)
    if args.tta:
        enable_tta(cfg, args.config)
    if args.out and library == 'mmdet' and not args.out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out must be a .pkl or .pickle file for mmdet configs, '
                         f'got {args.out}')
    if args.out and library == 'mmseg':
        cfg.test_evaluator.update(output_dir=args.out, keep_results=True)
    return cfg


def print_metrics(metrics, show_dir):
    """The metrics as a two-column table, on rank 0."""
    from mmengine.dist import get_rank
    if get_rank() != 0:
        return
    width = max([len(key) for key in metrics] + [6])
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    lines += [f'{key:<{width}}  {value:.4f}' if isinstance(value, float)
              else f'{key:<{width}}  {value}' for key, value in metrics.items()]
    if show_dir:
        lines.append(f'painted predictions: {osp.abspath(show_dir)}')
    print('\n'.join(lines), flush=True)


def main(argv=None):
    args = parse_args(argv)
    cfg = setup_config(args)
    apis.check_dataset_paths(cfg, ('test', ), args.config)
    apis.require_checkpoint(args.checkpoint)
    runner = build_runner(cfg, args.config)
    check_checkpoint_fits(args.checkpoint, runner.model, args.config)
    if args.out and cfg.default_scope == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    print_metrics(metrics, args.show_dir)
    return metrics


if __name__ == '__main__':
    main()
