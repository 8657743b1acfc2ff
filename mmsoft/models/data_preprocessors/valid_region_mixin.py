"""What the valid-region data preprocessors add to the libraries' ones."""
from typing import Any, Dict

import torch

from ..valid_region_record import register_valid_shapes


class ValidRegionMixin:
    """Records each image's valid region for the backbone after padding.

    Mixed in before an mmdet/mmseg data preprocessor. After the library's
    preprocessing (normalisation, padding, batch augments), the ``img_shape``
    of each data sample's metainfo (the image before padding) is recorded for
    the padded batch tensor (see :mod:`~mmsoft.models.valid_region_record`); the
    backbones look it up when called on that tensor. In training,
    validation, testing and test-time augmentation alike, every call
    records the regions of the batch it returns.
    """

    def forward(self, data: dict, training: bool = False) -> Dict[str, Any]:
        """The library's preprocessing, then the record of the valid regions.

        Args:
            data (dict): Data from the dataloader.
            training (bool): Whether training-time augmentation is on.

        Returns:
            dict: ``inputs`` and ``data_samples``, as the library returns them.
        """
        data = super().forward(data, training)
        inputs, samples = data['inputs'], data.get('data_samples')
        if isinstance(inputs, torch.Tensor) and samples:
            register_valid_shapes(inputs, [tuple(sample.metainfo['img_shape'][:2])
                                           for sample in samples])
        return data
