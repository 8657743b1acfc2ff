"""OpenMMLab adapter: the backbones with mmdet's conventions (:mod:`.backbones`,
torch alone), their registration in mmengine's ``MODELS`` (:mod:`.registry`,
imported by ``import mmsoft`` with mmengine) and the valid-region data
preprocessors."""
from .backbones import SOFT, UFOViT, register_valid_shapes, registered_valid_shapes

__all__ = ['SOFT', 'UFOViT', 'register_valid_shapes', 'registered_valid_shapes']
