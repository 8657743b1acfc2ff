"""Random erasing of one box per image (mmpretrain's ``RandomErasing`` transform)."""
import math
from numbers import Number
from typing import Optional, Sequence, Tuple, Union

import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS

from ..utils import check_choice
from .transforms import check_probability, per_channel


def random_box(height: int, width: int, area_range: Tuple[float, float],
               aspect_range: Tuple[float, float], max_attempts: int = 10
               ) -> Optional[Tuple[int, int, int, int]]:
    """A random box strictly inside an H x W image, or None.

    The box covers a fraction of the image drawn uniformly from
    ``area_range``, with a log-uniform aspect ratio (height / width) in
    ``aspect_range``; draws that do not fit strictly inside are re-drawn up
    to ``max_attempts`` times (timm's random erasing).

    Returns:
        tuple[int, int, int, int] | None: ``(top, left, height, width)``, or
        None when no draw fitted.
    """
    log_aspect = (math.log(aspect_range[0]), math.log(aspect_range[1]))
    for _ in range(max_attempts):
        area = np.random.uniform(*area_range) * height * width
        aspect = math.exp(np.random.uniform(*log_aspect))
        box_h = int(round(math.sqrt(area * aspect)))
        box_w = int(round(math.sqrt(area / aspect)))
        if 0 < box_h < height and 0 < box_w < width:
            top = int(np.random.randint(0, height - box_h + 1))
            left = int(np.random.randint(0, width - box_w + 1))
            return top, left, box_h, box_w
    return None


@TRANSFORMS.register_module()
class RandomErasing(BaseTransform):
    """Fills one random box of a uint8 image, with probability ``erase_prob``.

    Box: see :func:`random_box` (area ratio in [``min_area_ratio``,
    ``max_area_ratio``], aspect ratio in ``aspect_range``; mmpretrain draws
    once and clips the box to the image instead of re-drawing). Fill, as in
    mmpretrain: ``mode='const'``: ``fill_color``; ``mode='rand'``: every
    pixel from N(``fill_color``, ``fill_std``), truncated to integers and
    clipped to [0, 255], or uniform in [0, 255] when ``fill_std`` is None.
    DeiT's erasing of normalised images with N(0, 1) noise is
    ``mode='rand'`` with the normalisation's mean and std (BGR order).

    Required keys: ``img`` (H, W, 3) uint8. Modified keys: ``img``.

    Args:
        erase_prob (float): Probability of erasing an image. Default: 0.5.
        min_area_ratio (float): Least box area / image area. Default: 0.02.
        max_area_ratio (float): Largest box area / image area. Default: 0.4.
        aspect_range (float | tuple[float, float]): Box height / width
            range; a float ``a`` means ``(min(a, 1/a), max(a, 1/a))``.
            Default: (3/10, 10/3).
        mode (str): ``'const'`` or ``'rand'``. Default: ``'const'``.
        fill_color (float | Sequence[float]): Per-channel value, in the
            image's channel order. Default: (128, 128, 128).
        fill_std (float | Sequence[float], optional): Per-channel std of
            ``mode='rand'``. Default: None.
    """

    def __init__(self, erase_prob: float = 0.5, min_area_ratio: float = 0.02,
                 max_area_ratio: float = 0.4,
                 aspect_range: Union[float, Tuple[float, float]] = (3 / 10, 10 / 3),
                 mode: str = 'const',
                 fill_color: Union[Number, Sequence[Number]] = (128, 128, 128),
                 fill_std: Optional[Union[Number, Sequence[Number]]] = None):
        check_probability('erase_prob', erase_prob)
        if not 0 < min_area_ratio <= max_area_ratio <= 1:
            raise ValueError(f'min_area_ratio={min_area_ratio!r} and max_area_ratio='
                             f'{max_area_ratio!r} must satisfy 0 < min <= max <= 1.')
        if isinstance(aspect_range, Number):
            aspect_range = sorted((aspect_range, 1 / aspect_range))
        if len(aspect_range) != 2 or not 0 < aspect_range[0] <= aspect_range[1]:
            raise ValueError(f'aspect_range={aspect_range!r} is invalid; expected a '
                             f'positive float or (min, max) with 0 < min <= max.')
        check_choice('mode', mode, ('const', 'rand'))
        self.erase_prob = erase_prob
        self.area_range = (float(min_area_ratio), float(max_area_ratio))
        self.aspect_range = (float(aspect_range[0]), float(aspect_range[1]))
        self.mode = mode
        self.fill_color = per_channel('fill_color', fill_color)
        self.fill_std = None if fill_std is None else per_channel('fill_std', fill_std)

    def fill(self, height: int, width: int) -> np.ndarray:
        """The uint8 patch (height, width, 3) written into the box."""
        if self.mode == 'const':
            patch = np.broadcast_to(self.fill_color, (height, width, 3))
        elif self.fill_std is None:
            patch = np.random.uniform(0, 256, (height, width, 3))
        else:
            patch = np.random.normal(self.fill_color, self.fill_std,
                                     (height, width, 3)).astype(np.int32)
        return np.clip(patch, 0, 255).astype(np.uint8)

    def transform(self, results: dict) -> dict:
        img = results['img']
        if img.ndim != 3 or img.shape[-1] != 3:
            raise ValueError(f'RandomErasing expects (H, W, 3) images; got '
                             f'{img.shape}.')
        if np.random.rand() >= self.erase_prob:
            return results
        box = random_box(*img.shape[:2], self.area_range, self.aspect_range)
        if box is not None:
            top, left, height, width = box
            img = img.copy()
            img[top:top + height, left:left + width] = self.fill(height, width)
            results['img'] = img
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(erase_prob={self.erase_prob}, area_range='
                f'{self.area_range}, aspect_range={self.aspect_range}, mode='
                f'{self.mode!r}, fill_color={self.fill_color.tolist()}, fill_std='
                f'{None if self.fill_std is None else self.fill_std.tolist()})')
