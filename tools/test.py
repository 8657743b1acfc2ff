"""Evaluate a checkpoint of a detector (mmdet) or segmentor (mmseg).

The library is chosen from the config's ``default_scope``; options follow
mmdet's and mmseg's ``tools/test.py``::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE_OR_DIR]
        [--show-dir DIR] [--show] [--wait-time SECONDS] [--tta]
        [--cfg-options k=v ...] [--launcher none|pytorch|slurm]

``--out``: mmdet: a ``.pkl`` file of the raw predictions; mmseg: a folder of
predicted label maps. ``--show-dir``: a folder for images painted with the
predictions by the library's visualizer (relative paths are taken from the
current directory). ``--show``: each painted image in a window for
``--wait-time`` seconds (without a display: a warning, nothing shown).
``--tta``: test-time augmentation with the config's ``tta_model`` and
``tta_pipeline`` (mmdet supplies a flip default). The metrics are logged and
printed as a table at the end.

Before the runner is built, the test data paths are checked; after, the
checkpoint is loaded with ``weights_only=True`` and compared with the model, so
a truncated file, a file that is not a checkpoint or a checkpoint of another
model is reported by name with the reason.

The steps are functions of :mod:`mmsoft.apis` (:func:`mmsoft.apis.test`).
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


from mmsoft.apis import add_cfg_options, parse_with_launcher, test  # noqa: E402
from mmsoft.apis.visualization import DEFAULT_WAIT_TIME  # noqa: E402


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
    parser.add_argument('--show', action='store_true',
                        help='show each painted prediction in a window')
    parser.add_argument('--wait-time', type=float, default=DEFAULT_WAIT_TIME,
                        help='seconds each --show window stays (0: until a key '
                        'press)')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation (the config's tta_model "
                        'and tta_pipeline)')
    add_cfg_options(parser, 'test_dataloader.batch_size=2')
    return parse_with_launcher(parser, argv)


def main(argv: Optional[List[str]] = None) -> dict:
    """Parses the command line, tests the checkpoint and returns the metrics."""
    return test(parse_args(argv))


if __name__ == '__main__':
    main()
