"""A generated semantic-segmentation dataset in the ADE20K directory layout.

Layout under ``root`` (as in ``ADEChallengeData2016``)::

    images/training/ADE_train_00000001.jpg ...
    images/validation/ADE_val_00000001.jpg ...
    annotations/training/ADE_train_00000001.png ...
    annotations/validation/ADE_val_00000001.png ...

Label PNGs follow ADE20K's encoding: single-channel uint8, ``0`` is reserved
for "unlabelled" (mmseg's ``reduce_zero_label=True`` maps it to the ignore
index 255 and shifts the others down by one), ``1`` is the background and
``2..K+1`` are the shape classes. After the reduction the training classes
are therefore ``('background', *shapes)``.
"""
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
    """Writes one split's images and label maps.

    Args:
        root (str): Dataset root.
        split (str): ``'train'`` or ``'val'``.
        num_images (int): Number of images.
        seed (int): Seed of this split's random generator.
        classes (Sequence[str]): Shape names, label values 2..K+1.
        img_size (tuple[int, int]): (height, width).
        **scene_kwargs: Passed to :func:`~demo_data.scenes.render_scene`.

    Returns:
        dict: ``images`` count and ``pixels`` per label value.
    """
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
    """Writes the training and validation splits of the generated ADE data.

    Args:
        root, num_train, num_val, seed, classes, img_size, **scene_kwargs: As
            for :func:`~demo_data.coco.generate_coco_demo`
            (its default image size, without its mixed sizes).

    Returns:
        dict: Per split, the ``images`` count and ``pixels`` per label value.
    """
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
