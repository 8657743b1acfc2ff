"""mmdet's data preprocessor that tells the backbones each image's valid region."""
from mmdet.models.data_preprocessors import DetDataPreprocessor

from .backbones import ValidRegionMixin


class ValidRegionDetDataPreprocessor(ValidRegionMixin, DetDataPreprocessor):
    """``DetDataPreprocessor`` whose padded batches carry each image's valid region."""
