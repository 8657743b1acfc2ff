"""Paint a detector's or a segmentor's predictions on one image.

mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer`` (from the config's
``default_scope``) runs the config and checkpoint on the image; the image
painted by the library's visualizer is written to ``--out-file``::

    python tools/inference_demo.py CONFIG CHECKPOINT IMAGE
        [--out-file FILE] [--device cpu|cuda] [--score-thr THR]

The step is :func:`mmsoft.apis.paint_predictions`.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional

# The repository root, so that ``import mmsoft`` and ``custom_imports=['mmsoft']``
# resolve also without an installed package.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

from mmsoft.apis.inference import (describe_prediction,  # noqa: E402
                                   paint_predictions)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Paint the predictions of a detector or a segmentor on an '
        'image.')
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


def main(argv: Optional[List[str]] = None):
    """Paints the predictions; prints where the image went and what it shows."""
    args = parse_args(argv)
    prediction = paint_predictions(args.config, args.checkpoint, args.image,
                                   args.out_file, args.device, args.score_thr)
    print(f'painted {describe_prediction(prediction, args.score_thr)}: '
          f'{args.out_file}', flush=True)
    return prediction


if __name__ == '__main__':
    main()
