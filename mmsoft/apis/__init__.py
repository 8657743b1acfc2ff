"""What mmdet's and mmseg's tools lack, for ``tools/train.py`` and
``tools/test.py``: the checks before a run (the library, data paths,
checkpoints, options), a hint for configs that do not import mmsoft, models
built in a config's scope, and distributed runs without CUDA."""
from .building import (build_in_scope, build_model_from_config, build_runner,
                       check_imports_mmsoft, register_cpu_ddp, setup_cpu_distributed)
from .checks import (LIBRARIES, check_amp, check_dataset_paths,
                     check_resumed_checkpoint, check_show, check_tta, leaf_datasets,
                     library_of, load_config, require_checkpoint)

__all__ = [
    'LIBRARIES', 'build_in_scope', 'build_model_from_config', 'build_runner',
    'check_amp', 'check_dataset_paths', 'check_imports_mmsoft',
    'check_resumed_checkpoint', 'check_show', 'check_tta', 'leaf_datasets',
    'library_of', 'load_config', 'register_cpu_ddp', 'require_checkpoint',
    'setup_cpu_distributed'
]
