"""Train a detector (mmdet) or segmentor (mmseg) from a config.

The library is chosen from the config's ``default_scope`` (``'mmdet'`` or
``'mmseg'``); options follow mmdet's and mmseg's ``tools/train.py``::

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--cfg-options k=v ...] [--launcher none|pytorch|slurm]

mmsoft's backbones are registered by the config itself
(``custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)``),
exactly as with mmdet's and mmseg's own tools, so a config that trains here
trains there too; a config that uses them without importing mmsoft is
reported with that hint. Before the runner is built, the dataset paths of the
config are checked and a missing data root or annotation file is reported by
name. A model type missing from the registry is reported with the hint to
import mmsoft. Checkpoints are loaded with ``torch.load(weights_only=True)``;
the few globals of mmengine checkpoints are allow-listed by
:mod:`mmsoft.checkpoint.safe_load`.

``--resume`` without a path resumes from the latest checkpoint in the work
directory (if any); with a path, from that checkpoint. The iteration and
epoch counters, optimizer, parameter schedulers and message hub continue from
the checkpoint.

The steps are functions of :mod:`mmsoft.apis` (:func:`mmsoft.apis.train`).
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

from mmsoft.apis import add_cfg_options, parse_with_launcher, train  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments (mmdet's and mmseg's ``train.py`` options)."""
    parser = argparse.ArgumentParser(
        description='Train a detector or a segmentor (mmdet / mmseg config).')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from the given checkpoint, or, without a value, from the '
        'latest checkpoint in the work directory')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (needs a CUDA device)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the total batch size')
    add_cfg_options(parser, "train_cfg.max_epochs=2 'optim_wrapper.optimizer.lr=1e-4'")
    return parse_with_launcher(parser, argv)


def main(argv: Optional[List[str]] = None) -> None:
    """Parses the command line and trains."""
    train(parse_args(argv))


if __name__ == '__main__':
    main()
