"""What the tools do, as functions: run set-up, data-path checks, the runner
with its registry hint, CPU distributed runs, ``train``/``test`` with
test-time augmentation and visualization, and painting the predictions of
one image (:func:`paint_predictions`, mmdet's and mmseg's inferencers).

``tools/train.py`` and ``tools/test.py`` parse the command line and call
:func:`train` or :func:`test`; each step can be used and tested on its own.
"""
from .checkpoints import require_checkpoint, resume_checkpoint
from .config import (LIBRARIES, add_cfg_options, apply_train_options, default_work_dir,
                     enable_amp, enable_auto_scale_lr, library_of, load_config,
                     parse_size, set_resume, set_work_dir)
from .data_paths import check_dataset_paths
from .distributed import parse_with_launcher, setup_cpu_distributed
from .inference import paint_predictions
from .runner import (build_in_scope, build_model_from_config, build_runner,
                     check_imports_mmsoft, library_registry)
from .test import apply_test_options, set_output, test
from .train import train
from .tta import enable_tta
from .visualization import check_show, enable_visualization

__all__ = [
    'LIBRARIES', 'add_cfg_options', 'apply_test_options', 'apply_train_options',
    'build_in_scope', 'build_model_from_config', 'build_runner',
    'check_dataset_paths', 'check_imports_mmsoft', 'check_show',
    'default_work_dir', 'enable_amp', 'enable_auto_scale_lr', 'enable_tta',
    'enable_visualization', 'library_of', 'library_registry', 'load_config',
    'paint_predictions', 'parse_size', 'parse_with_launcher', 'require_checkpoint',
    'resume_checkpoint', 'set_output', 'set_resume', 'set_work_dir',
    'setup_cpu_distributed', 'test', 'train'
]
