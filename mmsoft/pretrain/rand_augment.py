"""RandAugment with timm's "increasing" operations (DeiT's ``rand-m9-mstd0.5-inc1``).

:class:`RandAugment` takes the arguments of mmpretrain 1.x's ``RandAugment``
(the supported subset). Each operation is ``op(img, fraction)`` on a PIL RGB
image, where ``fraction = magnitude / total_level`` in [0, 1] scales the
operation's strongest setting; the operations are timm's definitions.
"""
from numbers import Number
from typing import Callable, Dict, List, Sequence, Tuple, Union

import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS
from PIL import Image, ImageEnhance, ImageOps

from ..utils import check_choice, check_positive_int
from .transforms import check_probability, per_channel

#: Largest rotation (degrees), shear (x per y) and translation (of the side).
MAX_ROTATE, MAX_SHEAR, MAX_TRANSLATE = 30., 0.3, 0.45
#: Largest change of the enhancement factors (colour, contrast...).
MAX_ENHANCE = 0.9
#: Largest value SolarizeAdd adds to the pixels below 128.
MAX_SOLARIZE_ADD = 110
#: PIL resampling filters of the geometric operations.
RESAMPLING = dict(nearest=Image.Resampling.NEAREST,
                  bilinear=Image.Resampling.BILINEAR,
                  bicubic=Image.Resampling.BICUBIC)


def random_sign(value: float) -> float:
    """``value`` with a random sign (one ``numpy.random.rand`` draw)."""
    return -value if np.random.rand() < 0.5 else value


def enhance_factor(fraction: float) -> float:
    """Enhancement factor ``1 +- 0.9 * fraction``, at least 0.1 ("increasing")."""
    return max(0.1, 1.0 + random_sign(fraction * MAX_ENHANCE))


def posterize_bits(fraction: float) -> int:
    """Bits kept by the increasing posterize: 4 down to 0."""
    return 4 - int(fraction * 4)


def solarize_threshold(fraction: float) -> int:
    """Pixels at or above it are inverted: 256 (none) down to 0 (all)."""
    return 256 - int(fraction * 256)


def posterize(img: Image.Image, bits: int) -> Image.Image:
    """Keeps the ``bits`` high bits of every pixel (0 bits: black).

    PIL's ``ImageOps.posterize`` rejects 0 bits, which the increasing
    posterize reaches at the largest magnitude.
    """
    mask = (0xFF << (8 - bits)) & 0xFF
    return img.point([i & mask for i in range(256)] * len(img.getbands()))


def solarize_add(img: Image.Image, fraction: float) -> Image.Image:
    """Adds ``int(fraction * 110)`` to the pixels below 128, saturating at 255."""
    add = int(fraction * MAX_SOLARIZE_ADD)
    lut = [min(255, i + add) if i < 128 else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def affine(img: Image.Image, matrix: Tuple[float, ...], fill: Tuple[int, ...],
           resample) -> Image.Image:
    """PIL affine warp: output (x, y) reads input ``(a x + b y + c, d x + e y + f)``."""
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=resample,
                         fillcolor=fill)


def build_ops(fill: Tuple[int, ...], resample) -> Dict[str, Callable]:
    """The operations by timm's names: ``op(img, fraction) -> img``.

    Args:
        fill (tuple[int]): RGB fill of the pixels the geometric ops uncover.
        resample: PIL resampling filter of the geometric ops.
    """
    def shear(img, fraction, axis):
        factor = random_sign(fraction * MAX_SHEAR)
        return affine(img, (1, factor, 0, 0, 1, 0) if axis == 'x' else
                      (1, 0, 0, factor, 1, 0), fill, resample)

    def translate(img, fraction, axis):
        shift = random_sign(fraction * MAX_TRANSLATE)
        return affine(img, (1, 0, shift * img.size[0], 0, 1, 0) if axis == 'x' else
                      (1, 0, 0, 0, 1, shift * img.size[1]), fill, resample)

    def enhance(enhancer):
        return lambda img, fraction: enhancer(img).enhance(enhance_factor(fraction))

    return {
        'AutoContrast': lambda img, fraction: ImageOps.autocontrast(img),
        'Equalize': lambda img, fraction: ImageOps.equalize(img),
        'Invert': lambda img, fraction: ImageOps.invert(img),
        'Rotate': lambda img, fraction: img.rotate(
            random_sign(fraction * MAX_ROTATE), resample=resample, fillcolor=fill),
        'PosterizeIncreasing': lambda img, fraction: posterize(
            img, posterize_bits(fraction)),
        'SolarizeIncreasing': lambda img, fraction: ImageOps.solarize(
            img, solarize_threshold(fraction)),
        'SolarizeAdd': solarize_add,
        'ColorIncreasing': enhance(ImageEnhance.Color),
        'ContrastIncreasing': enhance(ImageEnhance.Contrast),
        'BrightnessIncreasing': enhance(ImageEnhance.Brightness),
        'SharpnessIncreasing': enhance(ImageEnhance.Sharpness),
        'ShearX': lambda img, fraction: shear(img, fraction, 'x'),
        'ShearY': lambda img, fraction: shear(img, fraction, 'y'),
        'TranslateXRel': lambda img, fraction: translate(img, fraction, 'x'),
        'TranslateYRel': lambda img, fraction: translate(img, fraction, 'y'),
    }


#: Preset policies by mmpretrain's names; ``timm_increasing`` is timm's
#: ``_RAND_INCREASING_TRANSFORMS`` (DeiT), mmpretrain's operations
#: AutoContrast, Equalize, Invert, Rotate, Posterize, Solarize, SolarizeAdd,
#: ColorTransform, Contrast, Brightness, Sharpness, Shear and Translate
#: (horizontal, vertical) in this order.
RAND_AUGMENT_POLICIES = dict(
    timm_increasing=('AutoContrast', 'Equalize', 'Invert', 'Rotate',
                     'PosterizeIncreasing', 'SolarizeIncreasing', 'SolarizeAdd',
                     'ColorIncreasing', 'ContrastIncreasing', 'BrightnessIncreasing',
                     'SharpnessIncreasing', 'ShearX', 'ShearY', 'TranslateXRel',
                     'TranslateYRel'),
    simple_increasing=('AutoContrast', 'Equalize', 'Rotate', 'ShearX', 'ShearY'))
#: The keys of ``hparams`` that are used.
HPARAM_KEYS = ('pad_val', 'interpolation', 'prob')


def _policy_ops(policies: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """Operation names of a preset name or of a list of timm operation names."""
    if isinstance(policies, str):
        check_choice('policies', policies, RAND_AUGMENT_POLICIES)
        return RAND_AUGMENT_POLICIES[policies]
    known = RAND_AUGMENT_POLICIES['timm_increasing']
    unknown = [op for op in policies if op not in known]
    if not policies or unknown:
        raise ValueError(
            f'policies={policies!r} is not supported; expected one of '
            f'{sorted(RAND_AUGMENT_POLICIES)} or a list of operation names from '
            f'{list(known)} (policy dicts '
            f'are not supported).')
    return tuple(policies)


@TRANSFORMS.register_module()
class RandAugment(BaseTransform):
    """RandAugment as DeiT configures it (timm's ``rand-m9-mstd0.5-inc1``).

    ``num_policies`` operations are drawn uniformly, with replacement, from
    ``policies``; each is applied with probability ``hparams['prob']`` at a
    magnitude drawn from N(``magnitude_level``, ``magnitude_std``), clipped to
    [0, ``total_level``] (``magnitude_std='inf'``: uniform in [0,
    ``magnitude_level``]). The "increasing" operations grow stronger with the
    magnitude; rotations (up to 30 degrees), shears (up to 0.3) and
    translations (up to 45% of the side) take a random sign and fill the
    uncovered pixels with ``pad_val``.

    Required keys: ``img`` (BGR uint8). Modified keys: ``img``.

    Args:
        policies (str | Sequence[str]): ``'timm_increasing'`` (DeiT),
            ``'simple_increasing'``, or operation names of
            :data:`RAND_AUGMENT_POLICIES` ``['timm_increasing']``.
        num_policies (int): Operations per image.
        magnitude_level (float): Mean magnitude, in [0, ``total_level``].
        magnitude_std (float | str): Std of the magnitude, or ``'inf'``.
            Default: 0.
        total_level (float): Magnitude of the strongest setting. Default: 10.
        hparams (dict): ``pad_val`` (int or (B, G, R), in the image's channel
            order; default 128), ``interpolation`` (``'nearest'``,
            ``'bilinear'`` or ``'bicubic'``, of all geometric operations;
            default ``'bicubic'``) and ``prob`` (of applying each drawn
            operation; default 0.5). Default: ``dict(pad_val=128)``.
    """

    def __init__(self, policies: Union[str, Sequence[str]], num_policies: int,
                 magnitude_level: float, magnitude_std: Union[float, str] = 0.,
                 total_level: float = 10., hparams: dict = dict(pad_val=128)):
        unknown = sorted(set(hparams) - set(HPARAM_KEYS))
        if unknown:
            raise ValueError(f'hparams keys {unknown} are not supported; expected '
                             f'some of {list(HPARAM_KEYS)}.')
        interpolation = hparams.get('interpolation', 'bicubic')
        check_choice('interpolation', interpolation, RESAMPLING)
        check_positive_int('num_policies', num_policies)
        if not total_level > 0 or not 0 <= magnitude_level <= total_level:
            raise ValueError(f'magnitude_level={magnitude_level!r} and total_level='
                             f'{total_level!r} must satisfy 0 <= magnitude_level <= '
                             f'total_level, total_level > 0.')
        if magnitude_std != 'inf' and not (isinstance(magnitude_std, Number)
                                           and magnitude_std >= 0):
            raise ValueError(f"magnitude_std={magnitude_std!r} is invalid; expected a "
                             f"number >= 0 or 'inf'.")
        self.prob = hparams.get('prob', 0.5)
        check_probability('hparams prob', self.prob)
        self.policies = _policy_ops(policies)
        self.num_policies = num_policies
        self.magnitude_level = magnitude_level
        self.magnitude_std = magnitude_std
        self.total_level = total_level
        self.pad_val = hparams.get('pad_val', 128)
        self.interpolation = interpolation
        pad_rgb = per_channel('hparams pad_val', self.pad_val)[::-1]
        self._functions = build_ops(tuple(int(v) for v in pad_rgb),
                                    RESAMPLING[interpolation])

    def random_magnitude(self) -> float:
        """One magnitude in [0, ``total_level``]."""
        if self.magnitude_std == 'inf':
            return float(np.random.uniform(0, self.magnitude_level))
        level = self.magnitude_level
        if self.magnitude_std > 0:
            level = np.random.normal(self.magnitude_level, self.magnitude_std)
        return float(np.clip(level, 0., self.total_level))

    def sample(self) -> List[Tuple[str, float]]:
        """The ``(operation, magnitude)`` pairs applied to one image."""
        chosen = []
        for index in np.random.randint(0, len(self.policies), size=self.num_policies):
            if np.random.rand() >= self.prob:
                continue
            chosen.append((self.policies[index], self.random_magnitude()))
        return chosen

    def apply(self, img: np.ndarray, chosen: List[Tuple[str, float]]) -> np.ndarray:
        """Applies ``(operation, magnitude)`` pairs to a BGR or gray uint8 image."""
        gray = img.ndim == 2 or img.shape[-1] == 1
        pil = Image.fromarray(img.reshape(img.shape[:2]) if gray else
                              np.ascontiguousarray(img[..., ::-1]))
        for name, level in chosen:
            pil = self._functions[name](pil, level / self.total_level)
        out = np.asarray(pil)
        return out.reshape(img.shape) if gray else np.ascontiguousarray(out[..., ::-1])

    def transform(self, results: dict) -> dict:
        chosen = self.sample()
        if chosen:
            results['img'] = self.apply(results['img'], chosen)
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(num_policies={self.num_policies}, '
                f'magnitude_level={self.magnitude_level}, magnitude_std='
                f'{self.magnitude_std}, total_level={self.total_level}, '
                f'prob={self.prob}, pad_val={self.pad_val}, '
                f'policies={list(self.policies)})')
