"""Checkpoint files: ``weights_only`` loading (:mod:`.safe_load`), strict
comparison with a model (:mod:`.strict`), loading into the backbones
(:mod:`.loading`) and official SOFT checkpoints (:mod:`.soft_official`)."""
from .loading import (check_checkpoint_fits, innermost_model, load_soft_checkpoint,
                      load_state_dict_safely, load_strictly, load_ufo_vit_checkpoint,
                      read_pretrained)
from .safe_load import (allow_mmengine_checkpoint_globals, load_checkpoint_file,
                        load_checkpoint_safely)
from .soft_official import soft_official_to_mmsoft
from .strict import (StateDictComparison, compare_state_dict, fit_state_dict,
                     grid_pos_embed_resizer, key_list, select_prefix, split_prefix,
                     strip_prefixes, unwrap_state_dict)

__all__ = [
    'allow_mmengine_checkpoint_globals', 'load_checkpoint_file',
    'load_checkpoint_safely', 'load_state_dict_safely', 'unwrap_state_dict',
    'strip_prefixes', 'split_prefix', 'select_prefix', 'key_list',
    'StateDictComparison', 'compare_state_dict', 'fit_state_dict',
    'grid_pos_embed_resizer', 'read_pretrained', 'load_strictly',
    'load_soft_checkpoint', 'load_ufo_vit_checkpoint', 'soft_official_to_mmsoft',
    'check_checkpoint_fits', 'innermost_model'
]
