"""Data preprocessors that hand each image's valid region to the backbones.

``type='ValidRegionDetDataPreprocessor'`` (mmdet) and
``type='ValidRegionSegDataPreprocessor'`` (mmseg) take the arguments of the
libraries' ``DetDataPreprocessor`` and ``SegDataPreProcessor``. They are
registered in mmengine's root ``MODELS`` registry as builders that import
mmdet or mmseg only when a config uses them, so importing mmsoft imports
neither library.
"""
from mmengine.registry import MODELS


@MODELS.register_module(name='ValidRegionDetDataPreprocessor')
def build_valid_region_det_preprocessor(**kwargs):
    """:class:`~.det.ValidRegionDetDataPreprocessor` with ``kwargs``."""
    from .det import ValidRegionDetDataPreprocessor
    return ValidRegionDetDataPreprocessor(**kwargs)


@MODELS.register_module(name='ValidRegionSegDataPreprocessor')
def build_valid_region_seg_preprocessor(**kwargs):
    """:class:`~.seg.ValidRegionSegDataPreprocessor` with ``kwargs``."""
    from .seg import ValidRegionSegDataPreprocessor
    return ValidRegionSegDataPreprocessor(**kwargs)


__all__ = ['build_valid_region_det_preprocessor', 'build_valid_region_seg_preprocessor']
