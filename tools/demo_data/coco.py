"""A generated COCO-format instance-segmentation dataset: ``annotations/
instances_{train,val}.json`` and PNG images in ``train/`` and ``val/``. Each
annotation is one polygon (``iscrowd=0``) whose ``area`` and ``bbox`` are
those of its rasterised mask, as COCO's tools compute them."""
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
    """The outline of one connected region of ``mask`` as a flat COCO polygon,
    traced at ``upsample`` times the resolution along the pixel borders, so
    that pycocotools rasterises it back to the mask."""
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
    """The (height, width) of each image of a split: ``img_size``, or drawn
    from the inclusive ``img_side_range`` on a stream of ``seed`` of their
    own. A ``ValueError`` for a bad range."""
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
    """Writes one split's images and annotation file; ids start at
    ``first_image_id``. Returns the ``images`` and ``annotations`` counts."""
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
    """Writes the train and val splits (``num_train``, ``num_val`` images of
    ``img_size``, or of sides drawn from ``img_side_range``) of ``classes``
    from ``seed``; returns each split's counts."""
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
