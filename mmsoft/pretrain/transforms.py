"""Data transforms of the DeiT ImageNet recipe, in mmcv's transform interface.

Images are numpy arrays (H, W, 3) in BGR order, as mmcv's
``LoadImageFromFile`` produces them. Randomness comes from ``numpy.random``,
which mmengine seeds per worker.
"""
import math
from typing import Callable, Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS
from mmengine.structures import BaseDataElement
from PIL import Image, ImageEnhance, ImageOps

#: OpenCV interpolation flags by name.
INTERPOLATIONS = dict(nearest=cv2.INTER_NEAREST, bilinear=cv2.INTER_LINEAR,
                      bicubic=cv2.INTER_CUBIC, area=cv2.INTER_AREA,
                      lanczos=cv2.INTER_LANCZOS4)


def _interpolation(name: str) -> int:
    if name not in INTERPOLATIONS:
        raise ValueError(f'interpolation={name!r} is not supported; expected one of '
                         f'{sorted(INTERPOLATIONS)}.')
    return INTERPOLATIONS[name]


def _pair(size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """``size`` or ``(h, w)`` -> ``(h, w)``."""
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f'size={size!r} must be an int or (height, width).')
    return int(size[0]), int(size[1])


def _resize(img: np.ndarray, height: int, width: int, flag: int) -> np.ndarray:
    out = cv2.resize(img, (width, height), interpolation=flag)
    return out[..., None] if img.ndim == 3 and out.ndim == 2 else out


@TRANSFORMS.register_module()
class ClsRandomResizedCrop(BaseTransform):
    """Crops a random area and aspect ratio, then resizes to ``size``.

    The crop covers a fraction of the image drawn uniformly from ``scale``
    with a log-uniform aspect ratio (w / h) in ``ratio``; after
    ``max_attempts`` crops that do not fit, the largest centred crop with an
    aspect ratio inside ``ratio`` is taken (torchvision's
    ``RandomResizedCrop``, as DeiT uses it).

    Required keys: ``img``. Modified keys: ``img``, ``img_shape``.

    Args:
        size (int | tuple[int, int]): Output (height, width).
        scale (tuple[float, float]): Crop area / image area. Default:
            (0.08, 1.0).
        ratio (tuple[float, float]): Crop aspect ratio range. Default:
            (3/4, 4/3).
        interpolation (str): ``'bicubic'``, ``'bilinear'``...
            Default: ``'bicubic'``.
        max_attempts (int): Draws before the centred fallback. Default: 10.
    """

    def __init__(self, size: Union[int, Sequence[int]],
                 scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3. / 4., 4. / 3.),
                 interpolation: str = 'bicubic', max_attempts: int = 10):
        self.size = _pair(size)
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f'scale={scale!r} must satisfy 0 < min <= max <= 1.')
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f'ratio={ratio!r} must satisfy 0 < min <= max.')
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)
        self.interpolation = interpolation
        self.flag = _interpolation(interpolation)
        self.max_attempts = max_attempts

    def crop_box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        """A random ``(top, left, crop_h, crop_w)`` inside an H x W image."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(self.max_attempts):
            target = area * np.random.uniform(*self.scale)
            aspect = math.exp(np.random.uniform(*log_ratio))
            crop_w = int(round(math.sqrt(target * aspect)))
            crop_h = int(round(math.sqrt(target / aspect)))
            if 0 < crop_w <= width and 0 < crop_h <= height:
                top = int(np.random.randint(0, height - crop_h + 1))
                left = int(np.random.randint(0, width - crop_w + 1))
                return top, left, crop_h, crop_w
        aspect = width / height
        if aspect < self.ratio[0]:
            crop_w, crop_h = width, int(round(width / self.ratio[0]))
        elif aspect > self.ratio[1]:
            crop_h, crop_w = height, int(round(height * self.ratio[1]))
        else:
            crop_h, crop_w = height, width
        return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w

    def transform(self, results: dict) -> dict:
        img = results['img']
        top, left, crop_h, crop_w = self.crop_box(*img.shape[:2])
        img = img[top:top + crop_h, left:left + crop_w]
        results['img'] = _resize(img, *self.size, self.flag)
        results['img_shape'] = self.size
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(size={self.size}, scale={self.scale}, '
                f'ratio={self.ratio}, interpolation={self.interpolation!r})')


@TRANSFORMS.register_module()
class ClsResizeShortEdge(BaseTransform):
    """Resizes so that the shorter side is ``size``, keeping the aspect ratio.

    With ``CenterCrop(crop_size=int(size * 0.875))`` after it, this is the
    standard ImageNet evaluation transform (256 -> 224).

    Required keys: ``img``. Modified keys: ``img``, ``img_shape``,
    ``scale_factor``.

    Args:
        size (int): Length of the shorter side after resizing.
        interpolation (str): Default: ``'bicubic'``.
    """

    def __init__(self, size: int, interpolation: str = 'bicubic'):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f'size={size!r} must be a positive int.')
        self.size = size
        self.interpolation = interpolation
        self.flag = _interpolation(interpolation)

    def transform(self, results: dict) -> dict:
        img = results['img']
        height, width = img.shape[:2]
        scale = self.size / min(height, width)
        new_h = max(self.size, int(round(height * scale)))
        new_w = max(self.size, int(round(width * scale)))
        results['img'] = _resize(img, new_h, new_w, self.flag)
        results['img_shape'] = (new_h, new_w)
        results['scale_factor'] = (new_w / width, new_h / height)
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(size={self.size}, '
                f'interpolation={self.interpolation!r})')


# ---------------------------------------------------------------- RandAugment
#: Magnitudes are on a 0..10 scale (timm's ``_LEVEL_DENOM``).
MAX_LEVEL = 10.


def _signed(value: float) -> float:
    """``value`` with a random sign."""
    return -value if np.random.rand() < 0.5 else value


def _enhance_factor(level: float) -> float:
    """Enhancement factor 1 +- 0.9 * level / 10, at least 0.1 ("increasing")."""
    return max(0.1, 1.0 + _signed(level / MAX_LEVEL * 0.9))


def _affine(img: Image.Image, matrix: Tuple[float, ...], fill: Tuple[int, ...],
            resample) -> Image.Image:
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=resample,
                         fillcolor=fill)


def _solarize_add(img: Image.Image, level: float) -> Image.Image:
    """Adds ``level / 10 * 110`` to the pixels below 128."""
    add = int(level / MAX_LEVEL * 110)
    lut = [min(255, i + add) if i < 128 else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def _ops(fill: Tuple[int, ...], resample) -> Dict[str, Callable]:
    """RandAugment operations: ``op(img, level) -> img`` on PIL RGB images."""
    return {
        'AutoContrast': lambda img, level: ImageOps.autocontrast(img),
        'Equalize': lambda img, level: ImageOps.equalize(img),
        'Invert': lambda img, level: ImageOps.invert(img),
        'Rotate': lambda img, level: img.rotate(
            _signed(level / MAX_LEVEL * 30.), resample=resample, fillcolor=fill),
        'PosterizeIncreasing': lambda img, level: ImageOps.posterize(
            img, 4 - int(level / MAX_LEVEL * 4)),
        'SolarizeIncreasing': lambda img, level: ImageOps.solarize(
            img, 256 - int(level / MAX_LEVEL * 256)),
        'SolarizeAdd': _solarize_add,
        'ColorIncreasing': lambda img, level: ImageEnhance.Color(img).enhance(
            _enhance_factor(level)),
        'ContrastIncreasing': lambda img, level: ImageEnhance.Contrast(img).enhance(
            _enhance_factor(level)),
        'BrightnessIncreasing': lambda img, level: ImageEnhance.Brightness(
            img).enhance(_enhance_factor(level)),
        'SharpnessIncreasing': lambda img, level: ImageEnhance.Sharpness(
            img).enhance(_enhance_factor(level)),
        'ShearX': lambda img, level: _affine(
            img, (1, _signed(level / MAX_LEVEL * 0.3), 0, 0, 1, 0), fill, resample),
        'ShearY': lambda img, level: _affine(
            img, (1, 0, 0, _signed(level / MAX_LEVEL * 0.3), 1, 0), fill, resample),
        'TranslateXRel': lambda img, level: _affine(
            img, (1, 0, _signed(level / MAX_LEVEL * 0.45) * img.size[0], 0, 1, 0),
            fill, resample),
        'TranslateYRel': lambda img, level: _affine(
            img, (1, 0, 0, 0, 1, _signed(level / MAX_LEVEL * 0.45) * img.size[1]),
            fill, resample),
    }


#: The operations of timm's ``rand-m9-mstd0.5-inc1`` policy (DeiT).
RAND_AUGMENT_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Rotate',
                    'PosterizeIncreasing', 'SolarizeIncreasing', 'SolarizeAdd',
                    'ColorIncreasing', 'ContrastIncreasing', 'BrightnessIncreasing',
                    'SharpnessIncreasing', 'ShearX', 'ShearY', 'TranslateXRel',
                    'TranslateYRel')


@TRANSFORMS.register_module()
class ClsRandAugment(BaseTransform):
    """RandAugment as DeiT configures it (timm's ``rand-m9-mstd0.5-inc1``).

    ``num_layers`` operations are drawn uniformly, with replacement, from
    ``ops``; each is applied with probability ``op_prob`` at a magnitude drawn
    from N(``magnitude``, ``magnitude_std``) and clipped to [0, 10]. The
    "increasing" variants grow stronger with the magnitude; rotations (up to
    30 degrees), shears (up to 0.3) and translations (up to 45% of the side)
    take a random sign and fill uncovered pixels with ``fill`` (RGB).

    Required keys: ``img`` (BGR uint8). Modified keys: ``img``.

    Args:
        num_layers (int): Operations per image. Default: 2.
        magnitude (float): Mean magnitude, 0..10. Default: 9.
        magnitude_std (float): Std of the magnitude. Default: 0.5.
        op_prob (float): Probability of applying each drawn op. Default: 0.5.
        ops (Sequence[str]): Operation names. Default:
            :data:`RAND_AUGMENT_OPS`.
        fill (Sequence[int]): RGB fill of geometric ops. Default: the ImageNet
            mean (124, 116, 104).
        interpolation (str): ``'bicubic'``, ``'bilinear'`` or ``'nearest'``
            for geometric ops. Default: ``'bicubic'``.
    """

    def __init__(self, num_layers: int = 2, magnitude: float = 9.,
                 magnitude_std: float = 0.5, op_prob: float = 0.5,
                 ops: Sequence[str] = RAND_AUGMENT_OPS,
                 fill: Sequence[int] = (124, 116, 104),
                 interpolation: str = 'bicubic'):
        resample = dict(nearest=Image.Resampling.NEAREST,
                        bilinear=Image.Resampling.BILINEAR,
                        bicubic=Image.Resampling.BICUBIC).get(interpolation)
        if resample is None:
            raise ValueError(f'interpolation={interpolation!r} must be nearest, '
                             f'bilinear or bicubic.')
        available = _ops(tuple(int(v) for v in fill), resample)
        unknown = [op for op in ops if op not in available]
        if unknown:
            raise ValueError(f'unknown RandAugment ops {unknown}; available: '
                             f'{sorted(available)}.')
        if not 0 <= magnitude <= MAX_LEVEL:
            raise ValueError(f'magnitude={magnitude!r} must lie in [0, {MAX_LEVEL}].')
        self.num_layers = num_layers
        self.magnitude = magnitude
        self.magnitude_std = magnitude_std
        self.op_prob = op_prob
        self.ops = tuple(ops)
        self.fill = tuple(int(v) for v in fill)
        self.interpolation = interpolation
        self._functions = available

    def sample(self) -> List[Tuple[str, float]]:
        """The ``(op, magnitude)`` pairs applied to one image."""
        chosen = []
        for index in np.random.randint(0, len(self.ops), size=self.num_layers):
            if np.random.rand() >= self.op_prob:
                continue
            level = self.magnitude
            if self.magnitude_std > 0:
                level = np.random.normal(self.magnitude, self.magnitude_std)
            chosen.append((self.ops[index], float(np.clip(level, 0., MAX_LEVEL))))
        return chosen

    def transform(self, results: dict) -> dict:
        chosen = self.sample()
        if not chosen:
            return results
        img = results['img']
        gray = img.ndim == 2 or img.shape[-1] == 1
        pil = Image.fromarray(img.reshape(img.shape[:2]) if gray else
                              np.ascontiguousarray(img[..., ::-1]))
        for name, level in chosen:
            pil = self._functions[name](pil, level)
        out = np.asarray(pil)
        results['img'] = out.reshape(img.shape) if gray else \
            np.ascontiguousarray(out[..., ::-1])
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(num_layers={self.num_layers}, '
                f'magnitude={self.magnitude}, magnitude_std={self.magnitude_std}, '
                f'op_prob={self.op_prob}, ops={len(self.ops)})')


@TRANSFORMS.register_module()
class PackClsInputs(BaseTransform):
    """Packs an image and its label for :class:`BackboneClassifier`.

    Returns ``dict(inputs=(C, H, W) uint8 tensor, data_samples=
    BaseDataElement(gt_label=(1, ) long tensor, metainfo=...))``.

    Args:
        meta_keys (Sequence[str]): Keys copied into the metainfo when present.
            Default: ``('img_path', 'ori_shape', 'img_shape', 'flip')``.
    """

    def __init__(self, meta_keys: Sequence[str] = ('img_path', 'ori_shape',
                                                   'img_shape', 'flip')):
        self.meta_keys = tuple(meta_keys)

    def transform(self, results: dict) -> dict:
        img = results['img']
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
        return f'{type(self).__name__}(meta_keys={self.meta_keys})'
