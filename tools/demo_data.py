"""The demo's datasets (``tools/generate_demo_data.py`` writes them): random
scenes of overlapping shapes on textured backgrounds, an object's class told
by its outline only, in the libraries' own layouts:

- COCO instance segmentation: ``annotations/instances_{train,val}.json`` and
  PNG images in ``train/`` and ``val/``; each annotation one polygon
  (``iscrowd=0``) whose ``area`` and ``bbox`` are its rasterised mask's;
- ADE20K-layout semantic segmentation (``images/`` and ``annotations/``, each
  ``training/`` and ``validation/``): 0 unlabelled (mmseg's
  ``reduce_zero_label`` ignores it), 1 the background, 2..K+1 the shapes;
- ImageNet-layout classification, one shape per image: ``train/<class>/*.png``,
  ``val/<class>/*.png`` and the lists ``meta/{train,val}.txt`` ("<class>/<file>
  <label>") and ``meta/classes.txt``, as mmpretrain's ``CustomDataset`` reads
  them; classes balanced and sorted, so folder order and labels agree.
"""
import glob
import json
import math
import os
import os.path as osp
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import cv2
import numpy as np


# --- Scenes
#: Sub-pixel precision used by ``cv2.fillPoly`` (coordinates scaled by 2**4).
_SHIFT = 4


def _regular_polygon(num: int, radius: float, phase: float) -> np.ndarray:
    angles = phase + 2 * np.pi * np.arange(num) / num
    return np.stack([np.cos(angles), np.sin(angles)], 1) * radius


def _turned_polygon(num: int, max_turn: float) -> Callable:
    """A regular ``num``-gon turned by a random angle below ``max_turn``."""
    def shape(radius: float, rng: np.random.Generator) -> np.ndarray:
        phase = rng.uniform(0, max_turn) if max_turn else 0.0
        return _regular_polygon(num, radius, phase)
    return shape


def _star(radius: float, rng: np.random.Generator) -> np.ndarray:
    outer = _regular_polygon(5, radius, rng.uniform(0, 2 * np.pi))
    phase = math.atan2(outer[0, 1], outer[0, 0]) + np.pi / 5
    inner = _regular_polygon(5, radius * 0.45, phase)
    return np.stack([outer, inner], 1).reshape(-1, 2)


def _cross(radius: float, rng: np.random.Generator) -> np.ndarray:
    arm = radius * 0.38
    pts = np.array([[-arm, -radius], [arm, -radius], [arm, -arm], [radius, -arm],
                    [radius, arm], [arm, arm], [arm, radius], [-arm, radius],
                    [-arm, arm], [-radius, arm], [-radius, -arm], [-arm, -arm]])
    theta = rng.uniform(0, np.pi / 2)
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    return pts @ rot.T


#: Outline generators: ``f(radius, rng) -> (N, 2)`` vertices around the origin.
SHAPES: Dict[str, Callable[[float, np.random.Generator], np.ndarray]] = {
    'circle': _turned_polygon(64, 0),
    'triangle': _turned_polygon(3, 2 * np.pi),
    'square': _turned_polygon(4, np.pi / 2),
    'star': _star,
    'cross': _cross,
}

#: Classes of the generated datasets unless told otherwise.
DEFAULT_CLASSES: Tuple[str, ...] = ('circle', 'triangle', 'square', 'star')


@dataclass(eq=False)
class SceneObject:
    """One painted object: its ``label`` and masks, bool (H, W)."""
    label: int
    full_mask: np.ndarray
    visible_mask: np.ndarray


@dataclass(eq=False)
class Scene:
    """A BGR ``image``, uint8 (H, W, 3), and its ``objects`` in painting order."""
    image: np.ndarray
    objects: List[SceneObject]


def check_classes(classes: Sequence[str]) -> Tuple[str, ...]:
    """``classes`` as a tuple; a ValueError unless 3 or more distinct shapes."""
    classes = tuple(classes)
    unknown = [c for c in classes if c not in SHAPES]
    if unknown:
        raise ValueError(f'unknown shape classes {unknown}; available: {list(SHAPES)}')
    if len(set(classes)) != len(classes) or len(classes) < 3:
        raise ValueError(f'classes={classes} must be at least 3 distinct shapes')
    return classes


def _smooth_noise(rng: np.random.Generator, height: int, width: int,
                  cells: int) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a random grid upsampled bicubically."""
    grid = rng.random((cells + 1, cells + 1, 3)).astype(np.float32)
    return np.clip(cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC),
                   0, 1)


def render_background(rng: np.random.Generator, height: int,
                      width: int) -> np.ndarray:
    """A uint8 (H, W, 3) background: a random colour, tint gradient and noise."""
    base = rng.uniform(40, 215, 3)
    tint = rng.uniform(-60, 60, 3)
    # float64, so that NumPy 1 and 2 (NEP 50) write identical files.
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height)[..., None]
    noise = _smooth_noise(rng, height, width, int(rng.integers(3, 8))) - 0.5
    img = base + tint * ramp + noise * rng.uniform(30, 90)
    # Thin straight strokes as clutter: edges that belong to no object.
    clutter = np.zeros((height, width, 3), np.float32)
    for _ in range(int(rng.integers(2, 7))):
        p1 = tuple(int(v) for v in rng.integers(0, [width, height]))
        p2 = tuple(int(v) for v in rng.integers(0, [width, height]))
        colour = tuple(float(v) for v in rng.uniform(-50, 50, 3))
        cv2.line(clutter, p1, p2, colour, int(rng.integers(1, 3)), cv2.LINE_AA)
    img = img + clutter + rng.normal(0, rng.uniform(4, 12), img.shape)
    return np.clip(img, 0, 255).astype(np.float32)


def _object_texture(rng: np.random.Generator, height: int, width: int,
                    background_mean: np.ndarray) -> np.ndarray:
    """Colour field of one object's box: a contrasting colour, shading, noise."""
    for _ in range(20):
        colour = rng.uniform(0, 255, 3)
        if np.abs(colour - background_mean).sum() > 120:
            break
    shade = (_smooth_noise(rng, height, width, 2)[..., :1] - 0.5) * rng.uniform(20, 60)
    return colour + shade + rng.normal(0, rng.uniform(3, 10), (height, width, 3))


def _polygon_mask(points: np.ndarray, height: int, width: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    pts = np.round(points * (1 << _SHIFT)).astype(np.int32)
    cv2.fillPoly(mask, [pts], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    return mask.astype(bool)


def render_scene(rng: np.random.Generator, height: int, width: int,
                 num_classes: int, shape_fns: Sequence[Callable],
                 num_objects: Tuple[int, int] = (2, 6),
                 size_range: Tuple[float, float] = (0.1, 0.6),
                 min_visible: float = 0.6, min_pixels: int = 40,
                 max_tries: int = 60) -> Scene:
    """One scene of ``num_objects`` (an inclusive range) objects, their
    diameters a log-uniform fraction ``size_range`` of the shorter side, each
    keeping ``min_visible`` of its area and ``min_pixels`` pixels."""
    side = min(height, width)
    lo, hi = np.log(size_range[0] * side), np.log(size_range[1] * side)
    while True:
        target = int(rng.integers(num_objects[0], num_objects[1] + 1))
        objects: List[SceneObject] = []
        for _ in range(target):
            for _ in range(max_tries):
                label = int(rng.integers(num_classes))
                radius = float(np.exp(rng.uniform(lo, hi))) / 2
                # Centres may lie near the border, but most of the shape stays in.
                margin = radius * 0.5
                cx = rng.uniform(margin, width - margin)
                cy = rng.uniform(margin, height - margin)
                outline = shape_fns[label](radius, rng) + [cx, cy]
                mask = _polygon_mask(outline, height, width)
                if mask.sum() < max(min_pixels, 0.75 * _full_area(outline)):
                    continue  # too small or cut off too much by the border
                if _keeps_visible(objects, mask, min_visible, min_pixels):
                    for obj in objects:
                        obj.visible_mask &= ~mask
                    objects.append(SceneObject(label, mask, mask.copy()))
                    break
        if len(objects) >= num_objects[0]:
            break
    background = render_background(rng, height, width)
    image = background.copy()
    for obj in objects:
        ys, xs = np.nonzero(obj.full_mask)
        box = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
        mask = obj.full_mask[box]
        texture = _object_texture(rng, mask.shape[0], mask.shape[1],
                                  background[obj.full_mask].mean(0))
        image[box][mask] = texture[mask]
    image = cv2.GaussianBlur(np.clip(image, 0, 255).astype(np.float32), (3, 3), 0.6)
    return Scene(np.clip(np.round(image), 0, 255).astype(np.uint8), objects)


def _full_area(outline: np.ndarray) -> float:
    """Shoelace area of a polygon."""
    x, y = outline[:, 0], outline[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def _keeps_visible(objects: List[SceneObject], new_mask: np.ndarray,
                   min_visible: float, min_pixels: int) -> bool:
    """Whether all earlier objects stay visible enough under ``new_mask``."""
    for obj in objects:
        remaining = obj.visible_mask & ~new_mask
        if (remaining.sum() < max(min_pixels, min_visible * obj.full_mask.sum())
                or not is_simple_region(remaining)):
            return False
    return is_simple_region(new_mask)


def is_simple_region(mask: np.ndarray) -> bool:
    """Whether ``mask`` is one connected region without holes."""
    num, _ = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    if num != 2:
        return False
    # A hole is a part of the complement not connected to the image border.
    outside = np.pad(~mask, 1, constant_values=True).astype(np.uint8)
    num, _ = cv2.connectedComponents(outside, connectivity=4)
    return num == 2


# --- Splits
def _generate(write_split: Callable, root: str, num_train: int, num_val: int,
              seed: int, **kwargs) -> Dict[str, dict]:
    """Each split's statistics from ``write_split(root, split, num_images,
    split_seed, first, **kwargs)``, the splits' seeds two streams of ``seed``
    and val's image numbers (from ``first``) continuing train's."""
    seeds = [int(stream.generate_state(1)[0])
             for stream in np.random.SeedSequence(seed).spawn(2)]
    splits = dict(train=(num_train, 1), val=(num_val, num_train + 1))
    return {split: write_split(root, split, count, split_seed, first, **kwargs)
            for (split, (count, first)), split_seed in zip(splits.items(), seeds)}


def _clean_folder(folder: str, pattern: str) -> str:
    """Creates ``folder`` without an earlier run's files of glob ``pattern``."""
    os.makedirs(folder, exist_ok=True)
    for path in glob.glob(osp.join(glob.escape(folder), pattern)):
        os.remove(path)
    return folder


def _scenes(seed: int, sizes: Sequence[Tuple[int, int]],
            classes: Sequence[str]) -> Iterator[Scene]:
    """One scene of ``classes`` for each (height, width) of ``sizes``."""
    rng = np.random.default_rng(seed)
    shape_fns = [SHAPES[name] for name in classes]
    for height, width in sizes:
        yield render_scene(rng, height, width, len(classes), shape_fns)


#: Colours of the classes of the datasets' ``metainfo``.
_PALETTE = [(220, 20, 60), (0, 130, 200), (60, 180, 75), (255, 160, 0),
            (145, 30, 180)]


# --- COCO instance segmentation
def mask_to_polygon(mask: np.ndarray, upsample: int = 4) -> List[float]:
    """One connected region of ``mask`` as a flat COCO polygon, traced along
    the pixel borders at ``upsample`` times the resolution."""
    fine = cv2.resize(mask.astype(np.uint8), None, fx=upsample, fy=upsample,
                      interpolation=cv2.INTER_NEAREST)
    contours, _ = cv2.findContours(fine, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    contour = max(contours, key=cv2.contourArea)
    contour = cv2.approxPolyDP(contour, upsample / 4, True).reshape(-1, 2)
    if len(contour) < 3:
        raise ValueError('region too small for a polygon')
    points = (contour.astype(np.float64) + 0.5) / upsample
    return [round(float(v), 3) for v in points.reshape(-1)]


def _annotations(scene: Scene, image_id: int, first_ann_id: int) -> List[dict]:
    from pycocotools import mask as mask_utils
    height, width = scene.image.shape[:2]
    anns = []
    for obj in scene.objects:
        polygon = mask_to_polygon(obj.visible_mask)
        rle = mask_utils.merge(mask_utils.frPyObjects([polygon], height, width))
        anns.append(dict(
            id=first_ann_id + len(anns), image_id=image_id, category_id=obj.label + 1,
            segmentation=[polygon], area=float(mask_utils.area(rle)),
            bbox=[round(float(v), 2) for v in mask_utils.toBbox(rle)], iscrowd=0))
    return anns


def check_side_range(img_side_range: Sequence[int]) -> None:
    """A ValueError unless ``img_side_range`` is ``(min, max)``, 32 <= min <= max."""
    if len(img_side_range) != 2 or not 32 <= img_side_range[0] <= img_side_range[1]:
        raise ValueError(f'img_side_range={tuple(img_side_range)} is not a valid '
                         'range; expected (min_side, max_side) with 32 <= '
                         'min_side <= max_side.')


def image_sizes(num_images: int, seed: int, img_size: Tuple[int, int] = (160, 160),
                img_side_range: Optional[Tuple[int, int]] = None
                ) -> List[Tuple[int, int]]:
    """The (height, width) of each image of a split: ``img_size``, or drawn
    from the inclusive ``img_side_range`` on a stream of ``seed``."""
    if img_side_range is None:
        return [tuple(img_size)] * num_images
    check_side_range(img_side_range)
    rng = np.random.default_rng([seed, 1])
    sides = rng.integers(img_side_range[0], img_side_range[1] + 1,
                         size=(num_images, 2))  # (N, 2): height, width
    return [(int(height), int(width)) for height, width in sides]


def _write_coco_split(root: str, split: str, num_images: int, seed: int,
                      first: int, classes: Sequence[str], img_size: Tuple[int, int],
                      img_side_range: Optional[Tuple[int, int]]) -> Dict[str, int]:
    """Writes one split's PNG images and annotation file; returns its counts."""
    sizes = image_sizes(num_images, seed, img_size, img_side_range)
    img_dir = _clean_folder(osp.join(root, split), '[0-9]' * 12 + '.png')
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    images, annotations = [], []
    scenes = _scenes(seed, sizes, classes)
    for image_id, ((height, width), scene) in enumerate(zip(sizes, scenes), first):
        file_name = f'{image_id:012d}.png'
        cv2.imwrite(osp.join(img_dir, file_name), scene.image,
                    [cv2.IMWRITE_PNG_COMPRESSION, 1])
        images.append(dict(id=image_id, file_name=file_name, height=height,
                           width=width))
        annotations += _annotations(scene, image_id, image_id * 100)
    info = dict(description=f'mmsoft generated shapes ({split}, seed {seed})',
                version='1.0')
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(classes)]
    with open(osp.join(root, f'annotations/instances_{split}.json'), 'w') as f:
        json.dump(dict(info=info, licenses=[], images=images, annotations=annotations,
                       categories=categories), f)
    return dict(images=len(images), annotations=len(annotations))


def generate_coco_demo(root: str, num_train: int = 600, num_val: int = 100,
                       seed: int = 0, classes: Sequence[str] = DEFAULT_CLASSES,
                       img_size: Tuple[int, int] = (160, 160),
                       img_side_range: Optional[Tuple[int, int]] = None
                       ) -> Dict[str, Dict[str, int]]:
    """Writes the train and val splits of ``classes`` from ``seed``; returns
    each split's counts."""
    return _generate(_write_coco_split, root, num_train, num_val, seed,
                     classes=check_classes(classes), img_size=img_size,
                     img_side_range=img_side_range)


def coco_metainfo(classes: Optional[Sequence[str]] = None) -> dict:
    """``metainfo`` for mmdet's ``CocoDataset`` on the generated data."""
    classes = check_classes(classes or DEFAULT_CLASSES)
    return dict(classes=classes, palette=_PALETTE[:len(classes)])


# --- ADE20K-layout semantic segmentation
ADE_SPLITS = dict(train=('training', 'ADE_train_'), val=('validation', 'ADE_val_'))
#: Label value of background pixels in the PNGs (before ``reduce_zero_label``).
BACKGROUND_VALUE = 1


def _write_ade_split(root: str, split: str, num_images: int, seed: int, first: int,
                     classes: Sequence[str], img_size: Tuple[int, int]
                     ) -> Dict[str, int]:
    """Writes one split's JPEG images and PNG label maps; returns the
    ``images`` count and the ``pixels`` of each label value."""
    folder, prefix = ADE_SPLITS[split]
    img_dir = _clean_folder(osp.join(root, 'images', folder), prefix + '*.jpg')
    ann_dir = _clean_folder(osp.join(root, 'annotations', folder), prefix + '*.png')
    pixels = np.zeros(len(classes) + 2, np.int64)
    scenes = _scenes(seed, [img_size] * num_images, classes)
    for index, scene in enumerate(scenes, 1):
        labels = np.full(scene.image.shape[:2], BACKGROUND_VALUE, np.uint8)
        for obj in scene.objects:
            labels[obj.visible_mask] = obj.label + BACKGROUND_VALUE + 1
        stem = f'{prefix}{index:08d}'
        cv2.imwrite(osp.join(img_dir, stem + '.jpg'), scene.image,
                    [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(osp.join(ann_dir, stem + '.png'), labels)
        pixels += np.bincount(labels.reshape(-1), minlength=len(pixels))
    return dict(images=num_images, pixels=pixels.tolist())


def generate_ade_demo(root: str, num_train: int = 600, num_val: int = 100,
                      seed: int = 0, classes: Sequence[str] = DEFAULT_CLASSES,
                      img_size: Tuple[int, int] = (160, 160)) -> Dict[str, dict]:
    """Writes the training and validation splits, with the arguments of
    :func:`generate_coco_demo`."""
    return _generate(_write_ade_split, root, num_train, num_val, seed,
                     classes=check_classes(classes), img_size=img_size)


def ade_metainfo(classes: Optional[Sequence[str]] = None) -> dict:
    """``metainfo`` for mmseg's ``BaseSegDataset`` with ``reduce_zero_label``:
    :func:`coco_metainfo`'s after a black ``background``."""
    coco = coco_metainfo(classes)
    return dict(classes=('background', ) + coco['classes'],
                palette=[(0, 0, 0)] + coco['palette'])


# --- ImageNet-layout classification
def _write_cls_split(root: str, split: str, num_images: int, seed: int, first: int,
                     classes: Sequence[str], img_size: Tuple[int, int],
                     size_range: Tuple[float, float] = (0.45, 0.85)
                     ) -> Dict[str, int]:
    """Writes one split's images, one shape each, and its list file; returns
    ``images`` and the count ``per_class``."""
    height, width = img_size
    rng = np.random.default_rng(seed)
    split_dir = osp.join(root, split)
    shutil.rmtree(split_dir, ignore_errors=True)  # images of an earlier run
    for name in classes:
        os.makedirs(osp.join(split_dir, name))
    lines, counts = [], [0] * len(classes)
    for index in range(num_images):
        label = index % len(classes)
        scene = render_scene(rng, height, width, 1, [SHAPES[classes[label]]],
                             num_objects=(1, 1), size_range=size_range)
        relative = f'{classes[label]}/{first + index:06d}.png'
        cv2.imwrite(osp.join(split_dir, relative), scene.image,
                    [cv2.IMWRITE_PNG_COMPRESSION, 1])
        lines.append(f'{relative} {label}\n')
        counts[label] += 1
    with open(osp.join(root, f'meta/{split}.txt'), 'w') as file:
        file.writelines(lines)
    return dict(images=num_images, per_class=counts)


def generate_classification_demo(root: str, num_train: int = 400, num_val: int = 100,
                                 seed: int = 0,
                                 classes: Sequence[str] = DEFAULT_CLASSES,
                                 img_size: Tuple[int, int] = (64, 64)
                                 ) -> Dict[str, Dict[str, int]]:
    """Writes the train and val splits of sorted ``classes`` from ``seed``;
    returns their counts and the ``classes``."""
    classes = tuple(sorted(check_classes(classes)))
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    stats = _generate(_write_cls_split, root, num_train, num_val, seed,
                      classes=classes, img_size=tuple(img_size))
    with open(osp.join(root, 'meta/classes.txt'), 'w') as file:
        file.writelines(f'{name}\n' for name in classes)
    stats['classes'] = list(classes)
    return stats
