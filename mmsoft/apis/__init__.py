"""What the tools do, as functions: run set-up, data-path checks, the runner
with its registry hint, CPU distributed runs, and ``train``/``test``.

``tools/train.py`` and ``tools/test.py`` parse the command line and call
:func:`train` or :func:`test`; each step can be used and tested on its own.
"""
from .checkpoints import require_checkpoint, resume_checkpoint
from .config import (LIBRARIES, apply_train_options, default_work_dir,
                     enable_amp, enable_auto_scale_lr, library_of, load_config,
                     set_resume, set_work_dir)
from .data_paths import check_dataset_paths
from .distributed import parse_with_launcher, setup_cpu_distributed
from .runner import (build_in_scope, build_runner, check_imports_mmsoft,
                     library_registry)
from .test import enable_visualization, set_output, test
from .train import train

__all__ = [
    'LIBRARIES', 'apply_train_options', 'build_in_scope', 'build_runner',
    'check_dataset_paths', 'check_imports_mmsoft', 'default_work_dir',
    'enable_amp', 'enable_auto_scale_lr', 'enable_visualization', 'library_of',
    'library_registry', 'load_config', 'parse_with_launcher', 'require_checkpoint',
    'resume_checkpoint', 'set_output', 'set_resume', 'set_work_dir',
    'setup_cpu_distributed', 'test', 'train'
]
