"""Registers the backbones (``type='SOFT'``, ``'UFOViT'``) and the
valid-region data preprocessors in mmengine's root ``MODELS``, where mmdet and
mmseg configs find them, and lets torch load mmengine checkpoints weights-only."""
from mmengine.registry import MODELS

from ..checkpoint.safe_load import allow_mmengine_checkpoint_globals
from .backbones import SOFT, UFOViT

MODELS.register_module(name='SOFT', module=SOFT)
MODELS.register_module(name='UFOViT', module=UFOViT)
# mmengine's runners and inferencers (mmdet's, mmseg's and mmpretrain's tools
# too) load mmengine checkpoints with torch.load's weights_only=True.
allow_mmengine_checkpoint_globals()


@MODELS.register_module(name='ValidRegionDetDataPreprocessor')
def build_valid_region_det_preprocessor(**kwargs):
    """mmdet's ``DetDataPreprocessor`` that records each image's valid region."""
    from .det_preprocessor import ValidRegionDetDataPreprocessor
    return ValidRegionDetDataPreprocessor(**kwargs)


@MODELS.register_module(name='ValidRegionSegDataPreprocessor')
def build_valid_region_seg_preprocessor(**kwargs):
    """mmseg's ``SegDataPreProcessor`` that records each image's valid region."""
    from .seg_preprocessor import ValidRegionSegDataPreprocessor
    return ValidRegionSegDataPreprocessor(**kwargs)
