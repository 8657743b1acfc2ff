"""Hands each image's valid region from the data preprocessor to the backbone.

mmdet's and mmseg's models call ``backbone(inputs)`` with the padded batch
only. The valid-region data preprocessors
(:mod:`~mmsoft.models.data_preprocessors`) record the regions for the batch
tensor they return; the backbones look them up for the tensor they receive.

The record is keyed by the identity of the batch tensor (held by a weak
reference, so it dies with the tensor): a backbone given any other tensor
(another batch, a crop of this one, a copy) finds nothing and treats every
pixel as valid, so a region is never applied to a batch it was not computed
for. Each process keeps its own records, so every DDP process sees the
regions of its own batch.
"""
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

_RECORDS: Dict[int, Tuple[weakref.ref, List[Tuple[int, int]]]] = {}


def register_valid_shapes(inputs: torch.Tensor,
                          valid_shapes: Sequence[Sequence[int]]) -> None:
    """Records each image's valid (h, w) for the padded batch ``inputs``.

    Args:
        inputs (Tensor): The padded batch, shape (B, C, H, W).
        valid_shapes (Sequence): One (h, w) in pixels per image, the
            top-left region of its canvas that holds the image.

    Raises:
        ValueError: If the count does not match the batch or a region does
            not fit in the canvas.
    """
    batch, height, width = inputs.shape[0], inputs.shape[-2], inputs.shape[-1]
    shapes = [(int(shape[0]), int(shape[1])) for shape in valid_shapes]
    if len(shapes) != batch or any(not (0 < h <= height and 0 < w <= width)
                                   for h, w in shapes):
        raise ValueError(f'valid_shapes={shapes} does not fit the batch of shape '
                         f'{tuple(inputs.shape)}; expected {batch} (h, w) with '
                         f'0 < h <= {height} and 0 < w <= {width}.')
    key = id(inputs)
    _RECORDS[key] = (weakref.ref(inputs, lambda _: _RECORDS.pop(key, None)), shapes)


def registered_valid_shapes(inputs: torch.Tensor) -> Optional[List[Tuple[int, int]]]:
    """The valid shapes recorded for exactly this tensor, or None.

    Args:
        inputs (Tensor): A batch, shape (B, C, H, W).

    Returns:
        list[tuple[int, int]] | None: One (h, w) per image, or None when
        nothing was recorded for ``inputs``.
    """
    record = _RECORDS.get(id(inputs))
    if record is None or record[0]() is not inputs:
        return None
    return list(record[1])
