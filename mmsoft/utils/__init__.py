"""Argument checks shared by the models and adapters, and the torch APIs newer
than the oldest tested torch (:mod:`.torch_compat`)."""
from .validation import (check_choice, check_divisible, check_frozen_stages,
                         check_lengths, check_mlp_ratio, check_out_indices,
                         check_positive_float, check_positive_int, check_rate,
                         resolve_arch)

__all__ = [
    'check_choice', 'check_divisible', 'check_frozen_stages',
    'check_lengths', 'check_mlp_ratio', 'check_out_indices', 'check_positive_float',
    'check_positive_int', 'check_rate', 'resolve_arch'
]
