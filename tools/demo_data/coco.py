"""A generated COCO-format instance-segmentation dataset.

Layout under ``root`` (the names mmdet's COCO configs expect, with the split
names ``train``/``val``)::

    annotations/instances_train.json
    annotations/instances_val.json
    train/000000000001.png ...
    val/000000000601.png ...

Images are lossless PNGs (COCO allows any format), so visualizers that name
their output after the input (mmdet's ``--show-dir``) write PNGs too.

Every annotation is a single polygon (``iscrowd=0``); its ``area`` and
``bbox`` are those of the polygon rasterised by pycocotools, exactly as COCO's
own tools compute them, so the mask of an annotation lies inside its box.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from .scenes import (DEFAULT_CLASSES, SHAPES, Scene, check_classes,
                     render_scene, split_seeds)

#: File names written under ``root``.
COCO_ANN_FILES = dict(train='annotations/instances_train.json',
                      val='annotations/instances_val.json')
COCO_IMG_DIRS = dict(train='train/', val='val/')


def mask_to_polygon(mask: np.ndarray, upsample: int = 4) -> List[float]:
    """Outline of a simple region as a flat COCO polygon ``[x1, y1, ...]``.

    The contour is traced on the mask upsampled ``upsample`` times, so that it
    runs along the pixel borders rather than through the boundary pixels'
    centres, and simplified by at most a quarter pixel: rasterised by
    pycocotools, the polygon gives back the mask.

    Args:
        mask (np.ndarray): bool (H, W), one connected region.
        upsample (int): Tracing resolution. Default: 4.

    Returns:
        list[float]: At least 3 vertices, in COCO's continuous coordinates
        (pixel ``i`` spans ``[i, i + 1)``).
    """
    fine = cv2.resize(mask.astype(np.uint8), None, fx=upsample, fy=upsample,
                      interpolation=cv2.INTER_NEAREST)
    contours, _ = cv2.findContours(fine, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    contour = max(contours, key=cv2.contourArea)
    contour = cv2.approxPolyDP(contour, upsample / 4, True).reshape(-1, 2)
    if len(contour) < 3:
        raise ValueError('region too small for a polygon')
    points = (contour.astype(np.float64) + 0.5) / upsample
    return [round(float(v), 3) for v in points.reshape(-1)]


def _annotations(scene: Scene, image_id: int, first_ann_id: int, height: int,
                 width: int) -> List[dict]:
    from pycocotools import mask as mask_utils
    anns = []
    for obj in scene.objects:
        polygon = mask_to_polygon(obj.visible_mask)
        rle = mask_utils.merge(mask_utils.frPyObjects([polygon], height, width))
        anns.append(dict(
            id=first_ann_id + len(anns),
            image_id=image_id,
            category_id=obj.label + 1,
            segmentation=[polygon],
            area=float(mask_utils.area(rle)),
            bbox=[round(float(v), 2) for v in mask_utils.toBbox(rle)],
            iscrowd=0))
    return anns


def check_side_range(img_side_range: Sequence[int]) -> None:
    """Raises ValueError unless ``img_side_range`` is ``(min, max)`` with
    ``32 <= min <= max``."""
    if len(img_side_range) != 2 or not 32 <= img_side_range[0] <= img_side_range[1]:
        raise ValueError(f'img_side_range={tuple(img_side_range)} is not a valid '
                         'range; expected (min_side, max_side) with 32 <= '
                         'min_side <= max_side.')


def image_sizes(num_images: int,
                seed: int,
                img_size: Tuple[int, int] = (160, 160),
                img_side_range: Optional[Tuple[int, int]] = None
                ) -> List[Tuple[int, int]]:
    """The (height, width) of each image of a split.

    Args:
        num_images (int): Number of images.
        seed (int): Seed of the split; the sizes are drawn from their own
            stream of it, so they leave the scenes' random stream untouched.
        img_size (tuple[int, int]): (height, width) of every image when
            ``img_side_range`` is None.
        img_side_range (tuple[int, int], optional): Inclusive (min, max) of
            an image side. Height and width are drawn independently and
            uniformly from it, so aspect ratios range from ``min:max`` to
            ``max:min``. Default: None (every image is ``img_size``).

    Returns:
        list[tuple[int, int]]: One (height, width) per image.

    Raises:
        ValueError: If ``img_side_range`` is not two sides with
            ``32 <= min <= max``.
    """
    if img_side_range is None:
        return [tuple(img_size)] * num_images
    check_side_range(img_side_range)
    rng = np.random.default_rng([seed, 1])
    sides = rng.integers(img_side_range[0], img_side_range[1] + 1,
                         size=(num_images, 2))  # (N, 2): height, width
    return [(int(height), int(width)) for height, width in sides]


def generate_coco_split(root: str,
                        split: str,
                        num_images: int,
                        seed: int,
                        classes: Sequence[str] = DEFAULT_CLASSES,
                        img_size: Tuple[int, int] = (160, 160),
                        first_image_id: int = 1,
                        img_side_range: Optional[Tuple[int, int]] = None,
                        **scene_kwargs) -> Dict[str, int]:
    """Writes one split: its images and its annotation file.

    Args:
        root (str): Dataset root.
        split (str): ``'train'`` or ``'val'``.
        num_images (int): Number of images.
        seed (int): Seed of this split's random generator.
        classes (Sequence[str]): Shape names (keys of
            :data:`~demo_data.scenes.SHAPES`), category ids 1..K.
        img_size (tuple[int, int]): (height, width).
        first_image_id (int): Id of the first image (ids are unique across
            splits when the caller offsets them).
        img_side_range (tuple[int, int], optional): Draws each image's
            height and width from this inclusive range instead of using
            ``img_size`` (see :func:`image_sizes`). Default: None.
        **scene_kwargs: Passed to :func:`~demo_data.scenes.render_scene`.

    Returns:
        dict: ``images`` and ``annotations`` counts.
    """
    classes = check_classes(classes)
    sizes = image_sizes(num_images, seed, img_size, img_side_range)
    rng = np.random.default_rng(seed)
    img_dir = osp.join(root, COCO_IMG_DIRS[split])
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    for name in os.listdir(img_dir):  # images of an earlier run
        if len(name) == 16 and name.endswith('.png') and name[:12].isdigit():
            os.remove(osp.join(img_dir, name))
    shape_fns = [SHAPES[name] for name in classes]
    images, annotations = [], []
    for index, (height, width) in enumerate(sizes):
        image_id = first_image_id + index
        scene = render_scene(rng, height, width, len(classes), shape_fns,
                             **scene_kwargs)
        file_name = f'{image_id:012d}.png'
        cv2.imwrite(osp.join(img_dir, file_name), scene.image,
                    [cv2.IMWRITE_PNG_COMPRESSION, 1])
        images.append(dict(id=image_id, file_name=file_name, height=height,
                           width=width))
        annotations += _annotations(scene, image_id,
                                    image_id * 100, height, width)
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(classes)]
    coco = dict(
        info=dict(description=f'mmsoft generated shapes ({split}, seed {seed})',
                  version='1.0'),
        licenses=[],
        images=images,
        annotations=annotations,
        categories=categories)
    with open(osp.join(root, COCO_ANN_FILES[split]), 'w') as f:
        json.dump(coco, f)
    return dict(images=len(images), annotations=len(annotations))


def generate_coco_demo(root: str,
                       num_train: int = 600,
                       num_val: int = 100,
                       seed: int = 0,
                       classes: Sequence[str] = DEFAULT_CLASSES,
                       img_size: Tuple[int, int] = (160, 160),
                       img_side_range: Optional[Tuple[int, int]] = None,
                       **scene_kwargs) -> Dict[str, Dict[str, int]]:
    """Writes the train and val splits of the generated COCO dataset.

    The splits use different streams of the same seed, so they share no image;
    the same arguments always produce the same files.

    Args:
        root (str): Dataset root, created if missing.
        num_train (int): Training images. Default: 600.
        num_val (int): Validation images. Default: 100.
        seed (int): Random seed. Default: 0.
        classes (Sequence[str]): Shape classes. Default:
            :data:`~demo_data.scenes.DEFAULT_CLASSES`.
        img_size (tuple[int, int]): (height, width). Default: (160, 160).
        img_side_range (tuple[int, int], optional): Inclusive (min, max) of
            the sides: each image's height and width are drawn from it, so
            sizes and aspect ratios vary (see :func:`image_sizes`); the
            ``mixed`` demo uses (96, 192). Default: None (every image is
            ``img_size``).
        **scene_kwargs: Passed to :func:`~demo_data.scenes.render_scene`.

    Returns:
        dict: Per split, the ``images`` and ``annotations`` counts.
    """
    train_seed, val_seed = split_seeds(seed)
    return dict(
        train=generate_coco_split(root, 'train', num_train, train_seed,
                                  classes, img_size, 1, img_side_range,
                                  **scene_kwargs),
        val=generate_coco_split(root, 'val', num_val, val_seed, classes,
                                img_size, num_train + 1, img_side_range,
                                **scene_kwargs))


def coco_metainfo(classes: Optional[Sequence[str]] = None) -> dict:
    """``metainfo`` for mmdet's ``CocoDataset`` on the generated data."""
    classes = check_classes(classes or DEFAULT_CLASSES)
    palette = [(220, 20, 60), (0, 130, 200), (60, 180, 75), (255, 160, 0),
               (145, 30, 180)]
    return dict(classes=classes, palette=palette[:len(classes)])
