"""mmdet's data preprocessor that tells the backbone each image's valid region."""
from mmdet.models.data_preprocessors import DetDataPreprocessor

from .backbones import ValidRegionMixin


class ValidRegionDetDataPreprocessor(ValidRegionMixin, DetDataPreprocessor):
    """:class:`mmdet.models.DetDataPreprocessor` whose padded batches carry
    each image's valid region to mmsoft's backbones
    (see :class:`~.backbones.ValidRegionMixin`). Same arguments."""
