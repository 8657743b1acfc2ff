"""The models in plain PyTorch: one file per family (:mod:`.soft`,
:mod:`.ufo_vit`), what both share (:mod:`.common`) and the memory-saving
twins of their blocks (:mod:`.memory_efficient`)."""
from .common import set_memory_efficient
from .soft import SOFT, set_exportable
from .ufo_vit import UFOViT
from . import memory_efficient  # noqa: E402,F401  (the blocks' twins register)

__all__ = ['SOFT', 'UFOViT', 'set_exportable', 'set_memory_efficient']
