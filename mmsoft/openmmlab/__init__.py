"""OpenMMLab adapter: the backbones with mmdet's conventions
(:mod:`.backbones`, which need only torch), their registration in
mmengine's ``MODELS`` (:mod:`.registry`, imported by ``import mmsoft``
where mmengine is installed), the valid-region data preprocessors and the
FLOP handles of mmsoft's operators."""
from .backbones import SOFT, UFOViT, register_valid_shapes, registered_valid_shapes

__all__ = ['SOFT', 'UFOViT', 'register_valid_shapes', 'registered_valid_shapes']
