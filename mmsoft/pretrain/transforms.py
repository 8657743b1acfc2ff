"""Resizing and packing transforms of the DeiT ImageNet recipe (mmpretrain's names).

:class:`RandomResizedCrop`, :class:`ResizeEdge` and :class:`PackInputs` take
the arguments of mmpretrain 1.x's transforms of the same names (the supported
subset), so a pipeline written for either library builds here. Images are
numpy arrays (H, W, C) in BGR order, as mmcv's ``LoadImageFromFile`` produces
them. Randomness comes from ``numpy.random``, which mmengine seeds per worker.
"""
import math
from numbers import Number
from typing import Sequence, Tuple, Union

import mmcv
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS
from mmengine.structures import BaseDataElement

from ..utils import check_choice, check_positive_int

#: Interpolations of :func:`mmcv.imresize` by backend.
INTERPOLATIONS = dict(cv2=('nearest', 'bilinear', 'bicubic', 'area', 'lanczos'),
                      pillow=('nearest', 'bilinear', 'bicubic', 'box', 'lanczos',
                              'hamming'))


def check_resize_options(interpolation: str, backend: str) -> None:
    """Raises unless ``backend`` and its ``interpolation`` are supported."""
    check_choice('backend', backend, INTERPOLATIONS)
    check_choice(f'interpolation (backend={backend!r})', interpolation,
                 INTERPOLATIONS[backend])


def check_probability(name: str, value) -> None:
    """Raises unless ``value`` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= 1:
        raise ValueError(f'{name}={value!r} is invalid; expected a probability in '
                         f'[0, 1].')


def per_channel(name: str, value: Union[Number, Sequence[Number]]) -> np.ndarray:
    """A number or 3 numbers -> float array (3, )."""
    values = [value] * 3 if isinstance(value, Number) else list(value)
    if len(values) != 3 or not all(isinstance(v, Number) for v in values):
        raise ValueError(f'{name}={value!r} is invalid; expected a number or 3 '
                         f'numbers (one per channel, in the image order).')
    return np.array(values, dtype=np.float64)


def resize(img: np.ndarray, height: int, width: int, interpolation: str,
           backend: str) -> np.ndarray:
    """(H, W, C) -> (height, width, C), keeping a single channel axis."""
    out = mmcv.imresize(img, (width, height), interpolation=interpolation,
                        backend=backend)
    return out[..., None] if img.ndim == 3 and out.ndim == 2 else out


def _pair(name: str, size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """``size`` or ``(h, w)`` -> ``(h, w)``, both positive ints."""
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or any(not isinstance(v, int) or v < 1 for v in pair):
        raise ValueError(f'{name}={size!r} is invalid; expected a positive int or '
                         f'(height, width).')
    return pair


def _range(name: str, value: Sequence[float], upper: float = math.inf
           ) -> Tuple[float, float]:
    """Checks ``0 < min <= max <= upper``."""
    if len(value) != 2 or not 0 < value[0] <= value[1] <= upper:
        raise ValueError(f'{name}={value!r} is invalid; expected (min, max) with '
                         f'0 < min <= max <= {upper}.')
    return float(value[0]), float(value[1])


@TRANSFORMS.register_module()
class RandomResizedCrop(BaseTransform):
    """Crops a random area and aspect ratio, then resizes to ``scale``.

    The crop covers a fraction of the image drawn uniformly from
    ``crop_ratio_range`` with a log-uniform aspect ratio (w / h) in
    ``aspect_ratio_range``; after ``max_attempts`` crops that do not fit, the
    largest centred crop with an aspect ratio inside the range is taken
    (torchvision's ``RandomResizedCrop``, as DeiT and mmpretrain use it).

    Required keys: ``img``. Modified keys: ``img``, ``img_shape`` (the
    output (height, width)).

    Args:
        scale (int | tuple[int, int]): Output (height, width).
        crop_ratio_range (tuple[float, float]): Crop area / image area.
            Default: (0.08, 1.0).
        aspect_ratio_range (tuple[float, float]): Crop aspect ratio range.
            Default: (3/4, 4/3).
        max_attempts (int): Draws before the centred fallback. Default: 10.
        interpolation (str): See :data:`INTERPOLATIONS`. Default:
            ``'bilinear'``.
        backend (str): ``'cv2'`` or ``'pillow'``. Default: ``'cv2'``.
    """

    def __init__(self, scale: Union[int, Sequence[int]],
                 crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                 aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                 max_attempts: int = 10, interpolation: str = 'bilinear',
                 backend: str = 'cv2'):
        self.scale = _pair('scale', scale)
        self.crop_ratio_range = _range('crop_ratio_range', crop_ratio_range, 1.)
        self.aspect_ratio_range = _range('aspect_ratio_range', aspect_ratio_range)
        if not isinstance(max_attempts, int) or max_attempts < 0:
            raise ValueError(f'max_attempts={max_attempts!r} is invalid; expected an '
                             f'int >= 0 (0: always the centred crop).')
        check_resize_options(interpolation, backend)
        self.max_attempts = max_attempts
        self.interpolation = interpolation
        self.backend = backend

    def crop_box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        """A random ``(top, left, crop_h, crop_w)`` inside an H x W image."""
        area = height * width
        min_ratio, max_ratio = self.aspect_ratio_range
        log_ratio = (math.log(min_ratio), math.log(max_ratio))
        for _ in range(self.max_attempts):
            target = area * np.random.uniform(*self.crop_ratio_range)
            aspect = math.exp(np.random.uniform(*log_ratio))
            crop_w = int(round(math.sqrt(target * aspect)))
            crop_h = int(round(math.sqrt(target / aspect)))
            if 0 < crop_w <= width and 0 < crop_h <= height:
                top = int(np.random.randint(0, height - crop_h + 1))
                left = int(np.random.randint(0, width - crop_w + 1))
                return top, left, crop_h, crop_w
        aspect = width / height
        if aspect < min_ratio:
            crop_w, crop_h = width, int(round(width / min_ratio))
        elif aspect > max_ratio:
            crop_h, crop_w = height, int(round(height * max_ratio))
        else:
            crop_h, crop_w = height, width
        return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w

    def transform(self, results: dict) -> dict:
        img = results['img']
        top, left, crop_h, crop_w = self.crop_box(*img.shape[:2])
        img = img[top:top + crop_h, left:left + crop_w]
        results['img'] = resize(img, *self.scale, self.interpolation, self.backend)
        results['img_shape'] = self.scale
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(scale={self.scale}, crop_ratio_range='
                f'{self.crop_ratio_range}, aspect_ratio_range='
                f'{self.aspect_ratio_range}, max_attempts={self.max_attempts}, '
                f'interpolation={self.interpolation!r}, backend={self.backend!r})')


@TRANSFORMS.register_module()
class ResizeEdge(BaseTransform):
    """Resizes so that one edge is ``scale`` long, keeping the aspect ratio.

    The other side becomes ``round(side * scale / edge)`` (mmpretrain
    truncates it instead: the two differ by one pixel when the fraction is
    at least 0.5). With ``CenterCrop(crop_size=int(scale * 0.875))`` after
    it and ``edge='short'``, this is the standard ImageNet evaluation
    transform (256 -> 224).

    Required keys: ``img``. Modified keys: ``img``, ``img_shape``. Added
    keys: ``scale`` (w, h), ``scale_factor`` (w, h).

    Args:
        scale (int): Length of the chosen edge after resizing.
        edge (str): ``'short'``, ``'long'``, ``'width'`` or ``'height'``.
            Default: ``'short'``.
        backend (str): ``'cv2'`` or ``'pillow'``. Default: ``'cv2'``.
        interpolation (str): See :data:`INTERPOLATIONS`. Default:
            ``'bilinear'``.
    """

    def __init__(self, scale: int, edge: str = 'short', backend: str = 'cv2',
                 interpolation: str = 'bilinear'):
        check_positive_int('scale', scale)
        check_choice('edge', edge, ('short', 'long', 'width', 'height'))
        check_resize_options(interpolation, backend)
        self.scale = scale
        self.edge = edge
        self.backend = backend
        self.interpolation = interpolation

    def output_size(self, height: int, width: int) -> Tuple[int, int]:
        """(new_h, new_w) of an H x W image."""
        resize_width = (self.edge == 'width'
                        or (self.edge == 'short' and width < height)
                        or (self.edge == 'long' and width > height))
        if resize_width:
            return max(1, int(round(height * self.scale / width))), self.scale
        return self.scale, max(1, int(round(width * self.scale / height)))

    def transform(self, results: dict) -> dict:
        img = results['img']
        height, width = img.shape[:2]
        new_h, new_w = self.output_size(height, width)
        results['img'] = resize(img, new_h, new_w, self.interpolation, self.backend)
        results['img_shape'] = (new_h, new_w)
        results['scale'] = (new_w, new_h)
        results['scale_factor'] = (new_w / width, new_h / height)
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(scale={self.scale}, edge={self.edge!r}, '
                f'backend={self.backend!r}, interpolation={self.interpolation!r})')


#: Metainfo keys of mmpretrain's ``PackInputs`` (copied when present).
DEFAULT_META_KEYS = ('sample_idx', 'img_path', 'ori_shape', 'img_shape',
                     'scale_factor', 'flip', 'flip_direction')


@TRANSFORMS.register_module()
class PackInputs(BaseTransform):
    """Packs an image and its label for :class:`~mmsoft.pretrain.BackboneClassifier`.

    Returns ``dict(inputs=(C, H, W) uint8 tensor, data_samples=
    BaseDataElement(gt_label=(1, ) long tensor, metainfo=...))``.

    Args:
        input_key (str): Key of the image. Default: ``'img'``.
        algorithm_keys (Sequence[str]): Only empty. Default: ().
        meta_keys (Sequence[str]): Keys copied into the metainfo when present.
            Default: :data:`DEFAULT_META_KEYS`.
    """

    def __init__(self, input_key: str = 'img', algorithm_keys: Sequence[str] = (),
                 meta_keys: Sequence[str] = DEFAULT_META_KEYS):
        if algorithm_keys:
            raise ValueError(f'algorithm_keys={algorithm_keys!r} is not supported; '
                             f'only ().')
        self.input_key = input_key
        self.meta_keys = tuple(meta_keys)

    def transform(self, results: dict) -> dict:
        img = results[self.input_key]
        if img.ndim == 2:
            img = img[..., None]
        inputs = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        sample = BaseDataElement(
            metainfo={k: results[k] for k in self.meta_keys if k in results})
        if 'gt_label' in results:
            sample.gt_label = torch.as_tensor(results['gt_label'],
                                              dtype=torch.long).reshape(-1)
        return dict(inputs=inputs, data_samples=sample)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(input_key={self.input_key!r}, '
                f'meta_keys={self.meta_keys})')
