"""mmseg's data preprocessor that tells the backbones each image's valid region."""
from mmseg.models.data_preprocessor import SegDataPreProcessor

from .backbones import ValidRegionMixin


class ValidRegionSegDataPreprocessor(ValidRegionMixin, SegDataPreProcessor):
    """``SegDataPreProcessor`` whose padded batches carry each image's valid region."""
