"""The models in plain PyTorch: one file per family (:mod:`.soft`,
:mod:`.ufo_vit`) and what both share (:mod:`.common`); their blocks call the
operations of :mod:`mmsoft.ops`."""
from .common import set_memory_efficient
from .soft import SOFT, set_exportable
from .ufo_vit import UFOViT

__all__ = ['SOFT', 'UFOViT', 'set_exportable', 'set_memory_efficient']
