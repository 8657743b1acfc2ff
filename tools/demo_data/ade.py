"""A generated semantic-segmentation dataset in the ADE20K layout
(``images/`` and ``annotations/``, each ``training/`` and ``validation/``).
Labels follow ADE20K: 0 unlabelled (mmseg's ``reduce_zero_label`` ignores it),
1 the background, 2..K+1 the shapes."""
import os
import os.path as osp
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

from .scenes import (DEFAULT_CLASSES, SHAPES, check_classes, render_scene,
                     split_seeds)

ADE_SPLITS = dict(train='training', val='validation')
ADE_PREFIX = dict(train='ADE_train_', val='ADE_val_')
#: Label value of background pixels in the PNGs (before ``reduce_zero_label``).
BACKGROUND_VALUE = 1


def generate_ade_split(root: str,
                       split: str,
                       num_images: int,
                       seed: int,
                       classes: Sequence[str] = DEFAULT_CLASSES,
                       img_size: Tuple[int, int] = (160, 160),
                       **scene_kwargs) -> Dict[str, int]:
    """Writes one split's JPEG images and PNG label maps; returns the
    ``images`` count and the ``pixels`` of each label value."""
    classes = check_classes(classes)
    height, width = img_size
    rng = np.random.default_rng(seed)
    img_dir = osp.join(root, 'images', ADE_SPLITS[split])
    ann_dir = osp.join(root, 'annotations', ADE_SPLITS[split])
    for folder, suffix in ((img_dir, '.jpg'), (ann_dir, '.png')):
        os.makedirs(folder, exist_ok=True)
        # mmseg lists the directories: files of an earlier, larger run go.
        for name in os.listdir(folder):
            if name.startswith(ADE_PREFIX[split]) and name.endswith(suffix):
                os.remove(osp.join(folder, name))
    shape_fns = [SHAPES[name] for name in classes]
    pixels = np.zeros(len(classes) + 2, np.int64)
    for index in range(num_images):
        scene = render_scene(rng, height, width, len(classes), shape_fns,
                             **scene_kwargs)
        labels = scene.label_map(background=BACKGROUND_VALUE,
                                 offset=BACKGROUND_VALUE + 1)
        stem = f'{ADE_PREFIX[split]}{index + 1:08d}'
        cv2.imwrite(osp.join(img_dir, stem + '.jpg'), scene.image,
                    [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(osp.join(ann_dir, stem + '.png'), labels)
        pixels += np.bincount(labels.reshape(-1), minlength=len(pixels))
    return dict(images=num_images, pixels=pixels.tolist())


def generate_ade_demo(root: str, num_train: int = 600, num_val: int = 100,
                      seed: int = 0, classes: Sequence[str] = DEFAULT_CLASSES,
                      img_size: Tuple[int, int] = (160, 160),
                      **scene_kwargs) -> Dict[str, dict]:
    """Writes the training and validation splits, with the arguments of
    :func:`~demo_data.coco.generate_coco_demo`."""
    train_seed, val_seed = split_seeds(seed)
    return dict(
        train=generate_ade_split(root, 'train', num_train, train_seed, classes,
                                 img_size, **scene_kwargs),
        val=generate_ade_split(root, 'val', num_val, val_seed, classes,
                               img_size, **scene_kwargs))


def ade_metainfo(classes: Optional[Sequence[str]] = None) -> dict:
    """``metainfo`` for mmseg's ``BaseSegDataset`` with ``reduce_zero_label``."""
    classes = ('background', ) + check_classes(classes or DEFAULT_CLASSES)
    palette = [[0, 0, 0], [220, 20, 60], [0, 130, 200], [60, 180, 75],
               [255, 160, 0], [145, 30, 180]]
    return dict(classes=classes, palette=palette[:len(classes)])
