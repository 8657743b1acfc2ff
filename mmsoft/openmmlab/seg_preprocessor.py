"""mmseg's data preprocessor that tells the backbone each image's valid region."""
from mmseg.models.data_preprocessor import SegDataPreProcessor

from .backbones import ValidRegionMixin


class ValidRegionSegDataPreprocessor(ValidRegionMixin, SegDataPreProcessor):
    """:class:`mmseg.models.SegDataPreProcessor` whose padded batches carry
    each image's valid region to mmsoft's backbones
    (see :class:`~.backbones.ValidRegionMixin`). Same arguments."""
