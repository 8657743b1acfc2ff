"""Paint a detector's or a segmentor's predictions on one image::

    python tools/inference_demo.py CONFIG CHECKPOINT IMAGE
        [--out-file FILE] [--device cpu|cuda] [--score-thr THR]
"""
import argparse
import os.path as osp
import sys

import numpy as np
from mmengine.config import Config
from mmengine.registry import DefaultScope

# The checkout, for ``custom_imports=['mmsoft']`` without an installed mmsoft.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

from mmsoft import apis  # noqa: E402
from mmsoft.checkpoint import check_checkpoint_fits  # noqa: E402

#: mmdet's default least score of a painted instance.
DEFAULT_SCORE_THR = 0.3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Paint the predictions of a detector or a segmentor on an image.')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('image', help='image file')
    parser.add_argument('--out-file', default='outputs/painted.jpg',
                        help='the painted image (default: %(default)s)')
    parser.add_argument('--device', default='cpu',
                        help='device, e.g. cpu or cuda:0 (default: %(default)s)')
    parser.add_argument('--score-thr', type=float, default=None,
                        help='detectors: least score of a painted instance '
                        '(default: 0.3)')
    return parser.parse_args(argv)


def paint_options(library, score_thr):
    """The inferencer's drawing options; a ``ValueError`` for a threshold
    outside [0, 1] or given to a segmentor."""
    if library == 'mmseg':
        if score_thr is not None:
            raise ValueError(f'score_thr={score_thr} is for detectors; '
                             'segmentors paint every pixel\'s class')
        return {}
    if library != 'mmdet':
        raise ValueError(f"inference takes mmdet or mmseg configs, got "
                         f"default_scope='{library}'")
    score_thr = DEFAULT_SCORE_THR if score_thr is None else score_thr
    if not 0 <= score_thr <= 1:
        raise ValueError(f'score_thr must be in [0, 1], got {score_thr}')
    return dict(pred_score_thr=score_thr)


def paint_predictions(config, checkpoint, image, out_file, device='cpu',
                      score_thr=None):
    """Predicts ``image`` (a file or a BGR array) and writes it painted to
    ``out_file``; returns mmdet's prediction dict or mmseg's class map."""
    import mmcv
    if not osp.isfile(config):
        raise FileNotFoundError(f'config file not found: {config}')
    cfg = Config.fromfile(config)
    library = apis.library_of(cfg, config)
    options = paint_options(library, score_thr)
    apis.check_imports_mmsoft(cfg, config)
    apis.require_checkpoint(checkpoint)
    if library == 'mmdet':
        from mmdet.apis import DetInferencer as Inferencer
    else:
        from mmseg.apis import MMSegInferencer as Inferencer
    with DefaultScope.overwrite_default_scope(library):
        inferencer = Inferencer(model=cfg, weights=checkpoint, device=device,
                                scope=library)
        check_checkpoint_fits(checkpoint, inferencer.model, config)
        result = inferencer(image, return_vis=True, **options)
    prediction, painted = result['predictions'], result['visualization']
    if library == 'mmdet':  # one image: lists of one
        prediction, painted = prediction[0], painted[0]
    mmcv.imwrite(painted[..., ::-1], out_file)  # RGB -> a BGR file
    return prediction


def describe_prediction(prediction, score_thr=None):
    """``'2 of 100 instances'`` (those at ``score_thr`` or above) or
    ``'classes [0, 1, 3]'``."""
    if isinstance(prediction, dict):
        least = DEFAULT_SCORE_THR if score_thr is None else score_thr
        shown = sum(score >= least for score in prediction['scores'])
        return f'{shown} of {len(prediction["scores"])} instances'
    return f'classes {sorted(np.unique(prediction).tolist())}'


def main(argv=None):
    args = parse_args(argv)
    prediction = paint_predictions(args.config, args.checkpoint, args.image,
                                   args.out_file, args.device, args.score_thr)
    print(f'painted {describe_prediction(prediction, args.score_thr)}: '
          f'{args.out_file}', flush=True)
    return prediction


if __name__ == '__main__':
    main()
