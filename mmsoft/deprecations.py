"""State-dict keys of earlier layouts, old -> new, renamed with a
``DeprecationWarning`` when a checkpoint loads. Options have one spelling."""
import re
import warnings
from typing import Dict, List, Mapping, Optional, Tuple

#: State-dict keys: class name -> [(old key pattern, new key template)], in order.
#: ``.ffn.`` became ``.mlp.``; SOFT's four lists became one module per stage.
RENAMED_STATE_DICT_KEYS = {
    'SOFT': [(r'(^|\.)ffn\.', r'\1mlp.'),
             (r'^patch_embeds\.(\d+)\.', r'stages.\1.patch_embed.'),
             (r'^pos_embeds\.(\d+)$', r'stages.\1.pos_embed'),
             (r'^stages\.(\d+)\.(\d+)\.', r'stages.\1.blocks.\2.'),
             (r'^cls_token$', 'stages.3.cls_token'),
             (r'^norm\.', 'stages.3.norm.')],
    'UFOViT': [(r'(^|\.)ffn\.', r'\1mlp.')],
}
_KEY_RULES = {name: [(re.compile(old), new) for old, new in rules]
              for name, rules in RENAMED_STATE_DICT_KEYS.items()}


def renamed_state_dict_keys(state_dict: Mapping,
                            class_name: Optional[str]) -> Tuple[dict, List[str]]:
    """``state_dict`` under the new keys (order kept) and the old keys renamed."""
    rules = _KEY_RULES.get(class_name, [])
    renamed, old_keys = {}, []
    for key, value in state_dict.items():
        new = key
        for pattern, template in rules:
            new = pattern.sub(template, new)
        renamed[new] = value
        if new != key:
            old_keys.append(key)
    return renamed, old_keys


def rename_deprecated_keys(state_dict: Mapping, class_name: Optional[str],
                           stacklevel: int = 2) -> Dict:
    """:func:`renamed_state_dict_keys`, warning once if a key was old."""
    renamed, old_keys = renamed_state_dict_keys(state_dict, class_name)
    if old_keys:
        pairs = renamed_state_dict_keys({key: None for key in old_keys[:3]},
                                        class_name)[0]
        shown = ', '.join(f'{old!r} is now {new!r}'
                          for old, new in zip(old_keys[:3], pairs))
        more = f' and {len(old_keys) - 3} more' if len(old_keys) > 3 else ''
        warnings.warn(f'checkpoint keys use deprecated names ({shown}{more}); loaded '
                      f'under the new names.', DeprecationWarning,
                      stacklevel=stacklevel + 1)
    return renamed
