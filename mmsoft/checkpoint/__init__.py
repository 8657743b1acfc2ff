"""Checkpoint files: safe loading, official-layout conversion, model fit."""
from .model_fit import check_checkpoint_fits, unwrap_model
from .soft_official import load_soft_checkpoint, soft_official_to_mmsoft
from .safe_load import (allow_mmengine_checkpoint_globals, load_checkpoint_safely,
                        load_state_dict_safely)

__all__ = [
    'check_checkpoint_fits', 'unwrap_model', 'allow_mmengine_checkpoint_globals',
    'load_checkpoint_safely', 'load_state_dict_safely', 'load_soft_checkpoint',
    'soft_official_to_mmsoft'
]
