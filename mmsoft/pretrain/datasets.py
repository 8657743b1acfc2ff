"""Image classification datasets in the ImageNet layout (mmpretrain's names)."""
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple, Union

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

#: File extensions read as images (compared case-insensitively).
IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff',
                  '.webp')


def find_images(folder: str, extensions: Sequence[str] = IMG_EXTENSIONS
                ) -> Tuple[List[str], List[Tuple[str, int]]]:
    """Classes and images of a ``folder/<class>/<image>`` tree.

    Class names are the sub-folder names, sorted; images are searched
    recursively below each class folder and listed in sorted order.

    Args:
        folder (str): The split folder, e.g. ``data/imagenet/train``.
        extensions (Sequence[str]): Accepted file extensions.

    Returns:
        tuple: Class names, and ``(path relative to folder, label)`` pairs.

    Raises:
        FileNotFoundError: ``folder`` does not exist.
        ValueError: It has no class sub-folders or no image.
    """
    if not osp.isdir(folder):
        raise FileNotFoundError(f'image folder not found: {folder}')
    classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    if not classes:
        raise ValueError(f'{folder} has no class sub-folders (expected '
                         f'{folder}/<class>/<image>).')
    extensions = tuple(ext.lower() for ext in extensions)
    samples = []
    for label, name in enumerate(classes):
        for root, _, files in sorted(os.walk(osp.join(folder, name))):
            for file in sorted(files):
                if file.lower().endswith(extensions):
                    path = osp.relpath(osp.join(root, file), folder)
                    samples.append((path.replace(os.sep, '/'), label))
    if not samples:
        raise ValueError(f'no image with extension {list(extensions)} under '
                         f'{folder}/<class>/.')
    return classes, samples


def read_class_names(path: str) -> List[str]:
    """Class names from a text file, one per line (blank lines skipped)."""
    with open(path, encoding='utf-8') as file:
        return [line.strip() for line in file if line.strip()]


def read_list_file(path: str) -> List[Tuple[str, int]]:
    """``(image path, label)`` pairs of an ImageNet-style list file.

    Each non-empty line is ``<path relative to the image folder> <label>``
    (e.g. ``n01440764/n01440764_10026.JPEG 0``); the path may contain spaces,
    the label is the last field.

    Raises:
        ValueError: A line without an integer label (file and line named).
    """
    samples = []
    with open(path, encoding='utf-8') as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not parts[1].lstrip('-').isdigit():
                raise ValueError(f'{path}:{number}: expected "<image path> <label>", '
                                 f'got {line!r}.')
            samples.append((parts[0], int(parts[1])))
    return samples


@DATASETS.register_module()
class CustomDataset(BaseDataset):
    """Images and class labels, ImageNet layout, as mmpretrain's ``CustomDataset``.

    Two ways to list the images under ``data_root/data_prefix['img_path']``:

    * ``ann_file`` given (relative to ``data_root``): a list file of
      ``<relative image path> <label>`` lines, e.g. ImageNet's
      ``meta/train.txt`` / ``meta/val.txt``;
    * no ``ann_file``: the folder holds one sub-folder per class; labels are
      the indices of the sorted folder names.

    Class names come from ``classes`` (a list, or a text file with one name
    per line, relative to ``data_root``), else from ``metainfo['classes']``,
    else from the folder names, else
    (a list file over a flat folder) are the label indices as strings.

    Every sample is ``dict(img_path=..., gt_label=int)`` before the pipeline.
    mmpretrain's ``ImageNet`` is this dataset with the 1000 ImageNet class
    names as ``classes``.

    Args:
        data_root (str): Dataset root. Default: ''.
        data_prefix (dict | str): Image folder under ``data_root``,
            ``dict(img_path='train')`` or just ``'train'``. Default: ''.
        ann_file (str): Optional list file. Default: ''.
        with_label (bool): Only True (labelled images). Default: True.
        classes (Sequence[str] | str, optional): Class names or a file of
            them. Default: None.
        extensions (Sequence[str]): Image extensions for the folder scan.
        **kwargs: Passed to :class:`mmengine.dataset.BaseDataset`
            (``pipeline``, ``test_mode``, ``indices``, ``lazy_init``...).
    """

    def __init__(self,
                 data_root: str = '',
                 data_prefix: Union[dict, str] = '',
                 ann_file: str = '',
                 with_label: bool = True,
                 classes: Optional[Union[Sequence[str], str]] = None,
                 extensions: Sequence[str] = IMG_EXTENSIONS,
                 **kwargs):
        if with_label is not True:
            raise ValueError(f'with_label={with_label!r} is not supported; only '
                             f'True (images with class labels).')
        if isinstance(data_prefix, str):
            data_prefix = dict(img_path=data_prefix)
        self._classes_arg = classes
        self.extensions = tuple(extensions)
        metainfo = kwargs.pop('metainfo', None)
        super().__init__(ann_file=ann_file, metainfo=metainfo, data_root=data_root,
                         data_prefix=data_prefix, **kwargs)

    def _class_names(self, folder_classes: Optional[List[str]],
                     labels: List[int]) -> Tuple[str, ...]:
        classes = self._classes_arg
        if isinstance(classes, str):
            path = classes if osp.isabs(classes) or not self.data_root else \
                osp.join(self.data_root, classes)
            classes = read_class_names(path)
        if classes is None:
            classes = (self._metainfo.get('classes') or folder_classes
                       or [str(i) for i in range(max(labels) + 1)])
        classes = tuple(classes)
        if max(labels) >= len(classes) or min(labels) < 0:
            raise ValueError(f'labels range over [{min(labels)}, {max(labels)}] but '
                             f'there are {len(classes)} classes.')
        return classes

    def load_data_list(self) -> List[dict]:
        """Lists the images with their labels and sets ``metainfo['classes']``."""
        folder = self.data_prefix.get('img_path', '') or self.data_root
        folder_classes = None
        if self.ann_file:
            if not osp.isfile(self.ann_file):
                raise FileNotFoundError(f'list file not found: {self.ann_file}')
            samples = read_list_file(self.ann_file)
            if not samples:
                raise ValueError(f'list file {self.ann_file} lists no image.')
            if osp.isdir(folder):
                subdirs = sorted(e.name for e in os.scandir(folder) if e.is_dir())
                folder_classes = subdirs or None
        else:
            folder_classes, samples = find_images(folder, self.extensions)
        labels = [label for _, label in samples]
        self._metainfo['classes'] = self._class_names(folder_classes, labels)
        return [dict(img_path=osp.join(folder, path), gt_label=label)
                for path, label in samples]
