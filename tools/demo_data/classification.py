"""A generated classification dataset in the ImageNet folder layout: one
shape per image, ``train/<class>/*.png`` and ``val/<class>/*.png``, lists
``meta/{train,val}.txt`` ("<class>/<file> <label>") and ``meta/classes.txt``,
as mmpretrain's ``CustomDataset`` reads them. Classes are balanced and
sorted, so folder order and labels agree."""
import os
import os.path as osp
import shutil
from typing import Dict, Sequence, Tuple

import cv2
import numpy as np

from .scenes import (DEFAULT_CLASSES, SHAPES, check_classes,
                                render_scene, split_seeds)

#: Folders and files written under ``root``.
CLS_SPLITS = ('train', 'val')
CLS_LIST_FILES = dict(train='meta/train.txt', val='meta/val.txt')
CLS_CLASSES_FILE = 'meta/classes.txt'


def render_shape_image(rng: np.random.Generator, height: int, width: int,
                       shape: str, size_range: Tuple[float, float] = (0.45, 0.85)
                       ) -> np.ndarray:
    """One BGR image of ``shape`` on a noisy background."""
    scene = render_scene(rng, height, width, 1, [SHAPES[shape]], num_objects=(1, 1),
                         size_range=size_range)
    return scene.image


def generate_classification_split(root: str, split: str, num_images: int,
                                  seed: int, classes: Sequence[str],
                                  img_size: Tuple[int, int], first_index: int = 1,
                                  **shape_kwargs) -> Dict[str, int]:
    """Writes one split's images and list file; returns ``images`` and the
    count ``per_class``."""
    height, width = img_size
    rng = np.random.default_rng(seed)
    split_dir = osp.join(root, split)
    if osp.isdir(split_dir):  # images of an earlier run
        shutil.rmtree(split_dir)
    for name in classes:
        os.makedirs(osp.join(split_dir, name))
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    lines, counts = [], [0] * len(classes)
    for index in range(num_images):
        label = index % len(classes)
        image = render_shape_image(rng, height, width, classes[label], **shape_kwargs)
        relative = f'{classes[label]}/{first_index + index:06d}.png'
        cv2.imwrite(osp.join(split_dir, relative), image,
                    [cv2.IMWRITE_PNG_COMPRESSION, 1])
        lines.append(f'{relative} {label}\n')
        counts[label] += 1
    with open(osp.join(root, CLS_LIST_FILES[split]), 'w') as file:
        file.writelines(lines)
    return dict(images=num_images, per_class=counts)


def generate_classification_demo(root: str, num_train: int = 400, num_val: int = 100,
                                 seed: int = 0,
                                 classes: Sequence[str] = DEFAULT_CLASSES,
                                 img_size: Tuple[int, int] = (64, 64),
                                 **shape_kwargs) -> Dict[str, Dict[str, int]]:
    """Writes the train and val splits (64x64 images of sorted ``classes``)
    from ``seed``; returns their counts and the ``classes``. A
    ``ValueError`` for unknown or too few classes, no images or sides < 32."""
    classes = tuple(sorted(check_classes(classes)))
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train={num_train} and num_val={num_val} must be '
                         f'positive.')
    if len(img_size) != 2 or min(img_size) < 32:
        raise ValueError(f'img_size={img_size!r} must be (height, width), each at '
                         f'least 32.')
    os.makedirs(root, exist_ok=True)
    stats = {}
    for (split, count, first), split_seed in zip(
            (('train', num_train, 1), ('val', num_val, num_train + 1)),
            split_seeds(seed)):
        stats[split] = generate_classification_split(
            root, split, count, split_seed, classes, tuple(img_size), first,
            **shape_kwargs)
    with open(osp.join(root, CLS_CLASSES_FILE), 'w') as file:
        file.writelines(f'{name}\n' for name in classes)
    stats['classes'] = list(classes)
    return stats
