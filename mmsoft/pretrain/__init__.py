"""ImageNet-style classification training on mmengine alone.

Pre-trains the mmsoft backbones (UFO-ViT has no public weights) with the DeiT
recipe. Everything is registered in mmengine's root registries, so configs
with ``default_scope = 'mmengine'`` and ``custom_imports = dict(imports=
['mmsoft', 'mmsoft.pretrain'])`` build it with mmengine's ``Runner``:

* :class:`BackboneClassifier` (``MODELS``): backbone + head, e.g.
  :class:`~mmsoft.pretrain.ClassAttentionHead`;
* :class:`ClassificationDataPreprocessor` (``MODELS``): normalisation,
  random erasing, Mixup/CutMix;
* :class:`ImageFolderDataset` (``DATASETS``): ImageNet folder layout or
  ``path label`` list files;
* ``ClsRandomResizedCrop``, ``ClsResizeShortEdge``, ``ClsRandAugment``,
  ``PackClsInputs`` (``TRANSFORMS``), next to mmcv's ``LoadImageFromFile``,
  ``RandomFlip`` and ``CenterCrop``;
* :class:`ClassificationAccuracy` (``METRICS``): top-k accuracy.

mmpretrain is not used: its models and transforms import torchvision at
module level, and no torchvision build for the CPU torch of this project can
be installed from the package index (the published wheels link CUDA
libraries and fail to import against a CPU torch).
"""
from .classifier import BackboneClassifier
from .data_preprocessor import ClassificationDataPreprocessor, mix_batch
from .datasets import ImageFolderDataset, find_images, read_class_names
from .metrics import ClassificationAccuracy
from .cls_to_backbone import ufo_vit_cls_to_backbone
from .demo_data import generate_classification_demo
from .head import ClassAttentionHead, soft_cross_entropy, topk_accuracy
from .transforms import (ClsRandAugment, ClsRandomResizedCrop, ClsResizeShortEdge,
                         PackClsInputs)

__all__ = [
    'BackboneClassifier', 'ClassificationDataPreprocessor', 'mix_batch',
    'ImageFolderDataset', 'find_images', 'read_class_names',
    'ClassificationAccuracy', 'ClsRandAugment', 'ClsRandomResizedCrop',
    'ClsResizeShortEdge', 'PackClsInputs', 'ufo_vit_cls_to_backbone',
    'generate_classification_demo', 'ClassAttentionHead', 'soft_cross_entropy',
    'topk_accuracy'
]
