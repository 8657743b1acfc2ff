"""Shared utilities: argument validation, safe checkpoint loading."""
from .checkpoint_safety import (allow_mmengine_checkpoint_globals,
                                load_checkpoint_safely, load_state_dict_safely)
from .validation import (check_choice, check_divisible, check_frozen_stages,
                         check_image_batch, check_lengths, check_out_indices,
                         check_positive_int, check_rate, resolve_arch)

__all__ = [
    'check_choice', 'check_divisible', 'check_frozen_stages', 'check_image_batch',
    'check_lengths', 'check_out_indices', 'check_positive_int', 'check_rate',
    'resolve_arch', 'load_checkpoint_safely',
    'load_state_dict_safely', 'allow_mmengine_checkpoint_globals'
]
