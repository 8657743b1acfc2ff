"""The models in plain PyTorch: one file per family (:mod:`.soft`,
:mod:`.ufo_vit`), the kernel math of SOFT (:mod:`.soft_kernels`) and what
both share: modules (:mod:`.layers`) and tensor functions (:mod:`.functional`)."""
from .layers import set_memory_efficient
from .soft import SOFT, set_exportable
from .ufo_vit import UFOViT

__all__ = ['SOFT', 'UFOViT', 'set_exportable', 'set_memory_efficient']
