"""ImageNet-style classification pre-training on mmengine alone.

Pre-trains the mmsoft backbones (UFO-ViT has no public weights) with the DeiT
recipe. Everything is registered in mmengine's root registries, so configs
with ``default_scope = 'mmengine'`` and ``custom_imports = dict(imports=
['mmsoft', 'mmsoft.pretrain'])`` build it with mmengine's ``Runner``. The
data pipeline, data preprocessor, dataset, metric and losses carry the names
and arguments of their mmpretrain 1.x counterparts (the supported subset;
other arguments raise), so that a config can switch to mmpretrain's classes:

* models (``MODELS``): :class:`BackboneClassifier` (backbone + head),
  :class:`ClassAttentionHead` (``head.py``, its layers in
  ``class_attention.py``), :class:`LabelSmoothLoss` and
  :class:`CrossEntropyLoss` (``losses.py``), :class:`ClsDataPreprocessor`
  (normalisation, Mixup/CutMix of ``batch_augments.py``);
* transforms (``TRANSFORMS``): :class:`RandomResizedCrop`,
  :class:`ResizeEdge`, :class:`PackInputs` (``transforms.py``),
  :class:`RandAugment` (``rand_augment.py``), :class:`RandomErasing`
  (``random_erasing.py``), next to mmcv's ``LoadImageFromFile``,
  ``RandomFlip`` and ``CenterCrop``;
* :class:`CustomDataset` (``DATASETS``): ImageNet folder layout or
  ``path label`` list files; ``demo_data.py`` generates such a dataset;
* :class:`Accuracy` (``METRICS``): top-k accuracy;
* ``cls_to_backbone.py``: classifier checkpoint -> backbone checkpoint.

mmpretrain itself is not used: its models and transforms import torchvision
at module level, and no torchvision build for the CPU torch of this project
can be installed from the package index (the published wheels link CUDA
libraries and fail to import against a CPU torch).
"""
from .batch_augments import mix_batch
from .class_attention import ClassAttentionBlock
from .classifier import BackboneClassifier
from .cls_to_backbone import ufo_vit_cls_to_backbone
from .data_preprocessor import ClsDataPreprocessor
from .datasets import CustomDataset, find_images, read_class_names
from .demo_data import generate_classification_demo
from .head import ClassAttentionHead
from .losses import CrossEntropyLoss, LabelSmoothLoss, soft_cross_entropy
from .metrics import Accuracy, topk_accuracy
from .rand_augment import RandAugment
from .random_erasing import RandomErasing
from .transforms import PackInputs, RandomResizedCrop, ResizeEdge

__all__ = [
    'mix_batch', 'ClassAttentionBlock', 'BackboneClassifier',
    'ufo_vit_cls_to_backbone', 'ClsDataPreprocessor', 'CustomDataset',
    'find_images', 'read_class_names', 'generate_classification_demo',
    'ClassAttentionHead', 'CrossEntropyLoss', 'LabelSmoothLoss',
    'soft_cross_entropy', 'Accuracy', 'topk_accuracy', 'RandAugment',
    'RandomErasing', 'PackInputs', 'RandomResizedCrop', 'ResizeEdge'
]
