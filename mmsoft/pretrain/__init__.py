"""ImageNet-style pre-training of UFO-ViT with mmpretrain.

The pre-training configs (``configs/ufo_vit/pretrain``) are mmpretrain
configs (``default_scope = 'mmpretrain'``): mmpretrain's ``ImageClassifier``,
data pipeline, RandAugment, Mixup/CutMix, losses, metric, dataset and
``EMAHook``, trained and evaluated with mmpretrain's ``tools/train.py`` and
``tools/test.py``. Their ``custom_imports = dict(imports=['mmsoft',
'mmsoft.pretrain'])`` add what mmpretrain does not have. Importing this
package registers in mmpretrain's ``MODELS`` registry
(``mmpretrain.registry.MODELS``):

* :class:`UFOViTClassAttentionHead` (``head.py``): an mmpretrain ``ClsHead`` with
  XCiT's class-attention layers (:class:`ClassAttentionBlock`,
  ``class_attention.py``, built on mmpretrain's XCiT block) over the tokens
  of the backbone's last output;
* :class:`UFOViTStride16` (``ufo_vit_stride16.py``): ``UFOViT`` with the last
  block's tokens as its only output, at stride 16 (no 2x2 max-pool), with
  the state-dict keys of ``UFOViT``.

Also here: ``cls_to_backbone.py`` turns an
``ImageClassifier`` checkpoint into a ``UFOViT`` backbone checkpoint
(``tools/model_converters/ufo_vit_cls2backbone.py``).
"""
from .class_attention import ClassAttentionBlock
from .cls_to_backbone import ufo_vit_cls_to_backbone
from .head import UFOViTClassAttentionHead
from .ufo_vit_stride16 import UFOViTStride16

__all__ = [
    'ClassAttentionBlock', 'UFOViTClassAttentionHead', 'UFOViTStride16',
    'ufo_vit_cls_to_backbone'
]
