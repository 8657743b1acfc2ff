"""The models in plain PyTorch: one file per family (:mod:`.soft`,
:mod:`.ufo_vit`), the kernel math of SOFT (:mod:`.soft_kernels`) and what
both share (:mod:`.layers`)."""
from .layers import set_exportable, set_memory_efficient
from .soft import SOFT
from .ufo_vit import UFOViT

__all__ = ['SOFT', 'UFOViT', 'set_exportable', 'set_memory_efficient']
