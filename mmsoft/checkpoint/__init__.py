"""Checkpoint files: safe loading, unwrapping, strict comparison, conversion.

* :mod:`.safe_load`: ``weights_only`` loading with the allow-list of
  mmengine checkpoint globals.
* :mod:`.state_dict`: the state dict inside a checkpoint, key prefixes.
* :mod:`.strict`: key-by-key, shape-by-shape comparison of state dicts.
* :mod:`.pos_embed`: the resize hook for learned position embeddings.
* :mod:`.backbone_loading`: strict loading of a file into a backbone.
* :mod:`.soft_official`: reference SOFT checkpoints -> mmsoft key layout.
* :mod:`.model_fit`: whether a checkpoint belongs to a built model.
"""
from .backbone_loading import (load_soft_checkpoint, load_strictly,
                               load_ufo_vit_checkpoint, read_pretrained)
from .model_fit import check_checkpoint_fits, unwrap_model
from .pos_embed import grid_pos_embed_resizer
from .safe_load import (allow_mmengine_checkpoint_globals, load_checkpoint_file,
                        load_checkpoint_safely, load_state_dict_safely)
from .soft_official import soft_official_to_mmsoft
from .state_dict import (key_list, select_prefix, split_prefix, strip_key_prefixes,
                         strip_prefixes, unwrap_state_dict)
from .strict import StateDictComparison, compare_state_dict, fit_state_dict

__all__ = [
    'allow_mmengine_checkpoint_globals', 'load_checkpoint_file',
    'load_checkpoint_safely', 'load_state_dict_safely', 'unwrap_state_dict',
    'strip_key_prefixes', 'strip_prefixes', 'split_prefix', 'select_prefix',
    'key_list', 'StateDictComparison', 'compare_state_dict', 'fit_state_dict',
    'grid_pos_embed_resizer', 'read_pretrained', 'load_strictly',
    'load_soft_checkpoint', 'load_ufo_vit_checkpoint', 'soft_official_to_mmsoft',
    'check_checkpoint_fits', 'unwrap_model'
]
