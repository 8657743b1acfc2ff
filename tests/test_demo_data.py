"""The generated demo datasets: COCO validity, content statistics, ADE layout."""
import pytest

pytest.importorskip('cv2', reason='needs OpenCV, which the OpenMMLab stack brings '
                    '(mmcv): runs in the stack and floor environments')

import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
from pycocotools.coco import COCO

from demo_data import (DEFAULT_CLASSES, ade_metainfo, coco_metainfo, generate_coco_demo,
                       is_simple_region)

pytestmark = pytest.mark.openmmlab


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory) -> str:
    """50 train / 10 val images at the demo's 160x160 size."""
    root = str(tmp_path_factory.mktemp('coco'))
    generate_coco_demo(root, num_train=50, num_val=10, seed=0)
    return root


def _load(root: str, split: str) -> COCO:
    return COCO(osp.join(root, f'annotations/instances_{split}.json'))


def test_coco_loads_in_pycocotools(coco_root):
    for split, count, first_id in (('train', 50, 1), ('val', 10, 51)):
        coco = _load(coco_root, split)
        assert sorted(coco.getImgIds()) == list(range(first_id, first_id + count))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(
            DEFAULT_CLASSES)
        for img in coco.loadImgs(coco.getImgIds()):
            image = cv2.imread(osp.join(coco_root, split, img['file_name']))
            assert image.shape == (img['height'], img['width'], 3) == (160, 160, 3)
        anns = coco.loadAnns(coco.getAnnIds())
        assert len({a['id'] for a in anns}) == len(anns)
        assert all(a['iscrowd'] == 0 for a in anns)
        assert all(a['category_id'] in coco.getCatIds() for a in anns)


def test_masks_lie_inside_their_boxes(coco_root):
    coco = _load(coco_root, 'train')
    for ann in coco.loadAnns(coco.getAnnIds()):
        mask = coco.annToMask(ann).astype(bool)
        x, y, w, h = ann['bbox']
        ys, xs = np.nonzero(mask)
        assert ys.size == ann['area'] > 0
        assert xs.min() >= np.floor(x) and xs.max() < np.ceil(x + w)
        assert ys.min() >= np.floor(y) and ys.max() < np.ceil(y + h)
        # The box is tight: the mask touches all four sides.
        assert xs.min() == int(x) and ys.min() == int(y)
        assert xs.max() == int(x + w) - 1 and ys.max() == int(y + h) - 1
        assert len(ann['segmentation']) == 1 and len(ann['segmentation'][0]) >= 6
        assert is_simple_region(mask)


def test_object_statistics(coco_root):
    coco = _load(coco_root, 'train')
    per_image = [len(coco.getAnnIds(imgIds=i)) for i in coco.getImgIds()]
    assert min(per_image) >= 2 and max(per_image) <= 6
    assert len(set(per_image)) >= 4  # the count varies over the whole range
    anns = coco.loadAnns(coco.getAnnIds())
    counts = np.bincount([a['category_id'] for a in anns], minlength=5)[1:]
    assert len(counts) == 4 and counts.min() >= 0.1 * len(anns)
    # Sizes from COCO-"small" (< 32^2 px) to more than a fifth of the image.
    areas = np.array([a['area'] for a in anns])
    assert (areas < 32**2).mean() > 0.2
    assert areas.max() > 0.2 * 160 * 160 and areas.min() >= 40
    # Partial overlaps: boxes intersecting within one image.
    overlapping = 0
    for img_id in coco.getImgIds():
        boxes = [a['bbox'] for a in coco.loadAnns(coco.getAnnIds(imgIds=img_id))]
        overlapping += any(
            _intersect(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert overlapping >= 0.2 * len(per_image)


def _intersect(a, b) -> bool:
    return (min(a[0] + a[2], b[0] + b[2]) > max(a[0], b[0])
            and min(a[1] + a[3], b[1] + b[3]) > max(a[1], b[1]))


def test_colour_does_not_tell_the_class(coco_root):
    """Objects of every class come in many colours; the shape is the cue."""
    coco = _load(coco_root, 'train')
    colours, labels = [], []
    for img in coco.loadImgs(coco.getImgIds()):
        image = cv2.imread(osp.join(coco_root, 'train', img['file_name']))
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=img['id'])):
            inner = cv2.erode(coco.annToMask(ann), np.ones((3, 3), np.uint8))
            colours.append(image[inner.astype(bool)].mean(0))
            labels.append(ann['category_id'])
    colours, labels = np.array(colours), np.array(labels)
    for cat in coco.getCatIds():
        assert colours[labels == cat].std(0).mean() > 40  # widely spread
    # A nearest-class-mean classifier on colour stays near chance (1/4).
    half = len(labels) // 2
    means = np.stack([colours[:half][labels[:half] == c].mean(0)
                      for c in coco.getCatIds()])
    guess = np.argmin(((colours[half:, None] - means)**2).sum(-1), 1) + 1
    assert (guess == labels[half:]).mean() < 0.4


def test_background_is_textured(coco_root):
    image = cv2.imread(osp.join(coco_root, 'val', '000000000051.png'))
    coco = _load(coco_root, 'val')
    objects = np.zeros(image.shape[:2], bool)
    for ann in coco.loadAnns(coco.getAnnIds(imgIds=51)):
        objects |= coco.annToMask(ann).astype(bool)
    background = image[~objects].astype(np.float32)
    assert background.std(0).mean() > 8
    # Pixel-level noise: neighbouring pixels differ.
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY).astype(np.float32)
    assert np.abs(np.diff(grey, axis=1))[~objects[:, 1:]].mean() > 1.5


def test_same_seed_same_data(tmp_path):
    first = generate_coco_demo(str(tmp_path / 'a'), num_train=3, num_val=2, seed=7)
    generate_coco_demo(str(tmp_path / 'b'), num_train=3, num_val=2, seed=7)
    generate_coco_demo(str(tmp_path / 'c'), num_train=3, num_val=2, seed=8)
    assert first['train']['images'] == 3 and first['val']['images'] == 2

    def anns(name):
        with open(tmp_path / name / 'annotations/instances_train.json') as f:
            return json.load(f)['annotations']

    assert anns('a') == anns('b') != anns('c')


def test_ade_layout(small_ade):
    classes = ade_metainfo()['classes']
    assert classes == ('background', ) + DEFAULT_CLASSES
    for split, prefix, count in (('training', 'ADE_train_', 12),
                                 ('validation', 'ADE_val_', 4)):
        images = sorted(os.listdir(osp.join(small_ade, 'images', split)))
        labels = sorted(os.listdir(osp.join(small_ade, 'annotations', split)))
        assert len(images) == count
        assert [n[:-4] for n in images] == [n[:-4] for n in labels]
        assert images[0] == f'{prefix}00000001.jpg'
        values = set()
        for name in labels:
            label = cv2.imread(osp.join(small_ade, 'annotations', split, name),
                               cv2.IMREAD_UNCHANGED)
            assert label.dtype == np.uint8 and label.shape == (96, 128)
            values |= set(np.unique(label).tolist())
        # 0 is ADE's "unlabelled"; 1 background; 2..5 the shapes.
        assert values <= set(range(1, len(classes) + 1))
        assert 1 in values and len(values) >= 4


@pytest.mark.mmcv_ops  # mmseg.datasets imports mmcv.ops
def test_ade_loads_in_mmseg(small_ade):
    """mmseg's dataset with ADE20K's reduce_zero_label gives labels 0..K."""
    from mmengine.registry import DefaultScope
    from mmseg.datasets import BaseSegDataset
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', reduce_zero_label=True)]
    with DefaultScope.overwrite_default_scope('mmseg'):
        dataset = BaseSegDataset(
            data_root=small_ade, metainfo=ade_metainfo(), reduce_zero_label=True,
            img_suffix='.jpg', seg_map_suffix='.png', pipeline=pipeline,
            data_prefix=dict(img_path='images/validation',
                             seg_map_path='annotations/validation'))
        sample = dataset[0]
    assert len(dataset) == 4
    labels = np.unique(sample['gt_seg_map'])
    assert labels.min() == 0 and labels.max() <= 4  # background 0, shapes 1-4
    assert sample['img'].shape[:2] == sample['gt_seg_map'].shape == (96, 128)


@pytest.mark.mmcv_ops  # mmdet.datasets imports mmcv.ops
def test_coco_loads_in_mmdet(small_coco):
    from mmdet.datasets import CocoDataset
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        dataset = CocoDataset(
            data_root=small_coco, ann_file='annotations/instances_val.json',
            data_prefix=dict(img='val/'), metainfo=coco_metainfo(),
            pipeline=[dict(type='LoadImageFromFile'),
                      dict(type='LoadAnnotations', with_bbox=True,
                           with_mask=True)])
        sample = dataset[0]
    assert len(dataset) == 4
    assert 2 <= len(sample['gt_bboxes']) <= 6
    assert sample['gt_masks'].masks.shape[1:] == (96, 96)


def test_cli_writes_both(tmp_path, repo_root):
    result = subprocess.run(
        [sys.executable, osp.join(repo_root, 'tools/generate_demo_data.py'),
         '--coco-root', str(tmp_path / 'coco'), '--ade-root', str(tmp_path / 'ade'),
         '--num-train', '4', '--num-val', '2', '--img-size', '64', '80',
         '--classes', 'circle', 'square', 'cross'],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert 'train 4 images' in result.stdout
    coco = _load(str(tmp_path / 'coco'), 'val')
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == [
        'circle', 'square', 'cross']
    assert coco.loadImgs(coco.getImgIds())[0]['height'] == 64
    assert len(os.listdir(tmp_path / 'ade/annotations/training')) == 4


def test_cli_rejects_bad_arguments(tmp_path, repo_root, capsys):
    spec = importlib.util.spec_from_file_location(
        'generate_demo_data', osp.join(repo_root, 'tools/generate_demo_data.py'))
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    for argv in (['--classes', 'circle', 'hexagon'], ['--img-size', '16'],
                 ['--num-val', '0']):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    error = capsys.readouterr().err
    assert "invalid choice: 'hexagon'" in error and '>= 32' in error
    with pytest.raises(ValueError, match='at least 3 distinct'):
        generate_coco_demo(str(tmp_path), num_train=1, num_val=1,
                           classes=('circle', 'square'))


def test_default_sizes_write_the_pinned_files(tmp_path):
    from tests.helpers.dataset_digest import dataset_digest

    # Pinned from the generator before per-image sizes existed: without
    # img_side_range every image is img_size and the random streams are
    # untouched, so the files stay the same.
    generate_coco_demo(str(tmp_path), num_train=6, num_val=2, seed=0)
    assert dataset_digest(str(tmp_path)) == (
        '1a309ed3ea278b825d9ea41e399cda411765bbf9dfbf5615a3b5baa56a366c49')


def test_digest_of_no_files_raises(tmp_path):
    from tests.helpers.dataset_digest import dataset_digest
    (tmp_path / 'empty' / 'train').mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"root='.*empty' holds no file"):
        dataset_digest(str(tmp_path / 'empty'))
    with pytest.raises(FileNotFoundError, match=r"root='.*missing' is not a folder"):
        dataset_digest(str(tmp_path / 'missing'))
