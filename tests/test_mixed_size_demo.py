"""The mixed-size demo: varied image sizes, padded batches, valid regions."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import contextlib
import functools
import importlib.util
import json
import os
import os.path as osp
import sys

import cv2
import numpy as np
import torch
from mmengine.config import Config

from demo_data import generate_coco_demo, image_sizes
from mmsoft.openmmlab.backbones import registered_valid_shapes
from tests.helpers.host_syncs import PACKAGE_DIR, HostSyncCounter
from tests.helpers.dataset_digest import dataset_digest

pytestmark = pytest.mark.openmmlab

MIXED = 'configs/demo/mask-rcnn_soft-tiny_fpn_demo-mixed.py'
MIXED_PLAIN = 'configs/demo/mask-rcnn_soft-tiny_fpn_demo-mixed-no-valid-region.py'
UFO_VIT_DEMO = 'configs/demo/mask-rcnn_ufo-vit-tiny_fpn_demo.py'
SIDES = (96, 192)


@pytest.fixture(scope='module')
def mixed_coco(tmp_path_factory) -> str:
    """8 train / 2 val images with sides drawn from 96-192 pixels."""
    root = str(tmp_path_factory.mktemp('mixed_coco'))
    generate_coco_demo(root, num_train=8, num_val=2, seed=0, img_side_range=SIDES)
    return root


def test_sizes_and_aspect_ratios_vary():
    sizes = np.array(image_sizes(200, seed=3, img_side_range=SIDES))  # (200, 2)
    assert sizes.min() == SIDES[0] and sizes.max() == SIDES[1]
    ratios = sizes[:, 0] / sizes[:, 1]
    assert 0.5 <= ratios.min() < 0.6 and 1.8 < ratios.max() <= 2.0
    assert (ratios < 1).mean() > 0.3 and (ratios > 1).mean() > 0.3
    assert len({tuple(size) for size in sizes}) > 150
    assert image_sizes(3, seed=3) == [(160, 160)] * 3


@pytest.mark.parametrize('bad', [(16, 64), (128, 96), (96,)])
def test_bad_side_range_raises(bad):
    with pytest.raises(ValueError, match=r'img_side_range=.*min_side <= max_side'):
        image_sizes(2, seed=0, img_side_range=bad)


def test_images_match_their_annotated_sizes(mixed_coco):
    with open(osp.join(mixed_coco, 'annotations/instances_train.json')) as f:
        images = json.load(f)['images']
    shapes = set()
    for img in images:
        image = cv2.imread(osp.join(mixed_coco, 'train', img['file_name']))
        assert image.shape == (img['height'], img['width'], 3)
        assert SIDES[0] <= min(image.shape[:2]) <= max(image.shape[:2]) <= SIDES[1]
        shapes.add(image.shape)
    assert len(shapes) == len(images)


def test_mixed_generator_is_deterministic(mixed_coco, tmp_path):
    generate_coco_demo(str(tmp_path / 'same'), num_train=8, num_val=2, seed=0,
                       img_side_range=SIDES)
    generate_coco_demo(str(tmp_path / 'other'), num_train=8, num_val=2, seed=1,
                       img_side_range=SIDES)
    assert dataset_digest(mixed_coco) == dataset_digest(str(tmp_path / 'same'))
    assert dataset_digest(mixed_coco) != dataset_digest(str(tmp_path / 'other'))


def test_cli_mixed_sizes_defaults(repo_root):
    spec = importlib.util.spec_from_file_location(
        'generate_demo_data', osp.join(repo_root, 'tools/generate_demo_data.py'))
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    args = cli.parse_args(['coco', '--mixed-sizes'])
    assert args.coco_root == 'data/demo_coco_mixed/'
    assert tuple(args.side_range) == SIDES
    assert cli.parse_args(['coco']).coco_root == 'data/demo_coco/'
    for argv in (['--mixed-sizes'], ['coco', '--mixed-sizes', '--side-range',
                                     '96', '64']):
        with pytest.raises(SystemExit):
            cli.parse_args(argv)


def test_configs_differ_only_in_the_preprocessor(repo_root):
    mixed = Config.fromfile(osp.join(repo_root, MIXED)).to_dict()
    plain = Config.fromfile(osp.join(repo_root, MIXED_PLAIN)).to_dict()
    assert mixed['model'].pop('data_preprocessor')['type'] == (
        'ValidRegionDetDataPreprocessor')
    assert plain['model'].pop('data_preprocessor')['type'] == 'DetDataPreprocessor'
    assert mixed == plain
    assert mixed['train_dataloader']['dataset']['data_root'] == (
        'data/demo_coco_mixed/')


# --------------------------------------------------------------------------
# One training iteration of each config on a padded batch of the mixed data
# --------------------------------------------------------------------------
def _train_batch(cfg: Config, data_root: str) -> dict:
    """A landscape and a portrait image through the config's train pipeline."""
    from mmdet.registry import DATASETS
    from mmengine.dataset import pseudo_collate
    dataset_cfg = cfg.train_dataloader.dataset
    dataset_cfg.data_root = data_root
    dataset = DATASETS.build(dataset_cfg)
    items = [dataset[index] for index in range(len(dataset))]
    landscape = next(i for i in items if i['data_samples'].img_shape[0] <
                     i['data_samples'].img_shape[1])
    portrait = next(i for i in items if i['data_samples'].img_shape[0] >
                    i['data_samples'].img_shape[1])
    return pseudo_collate([landscape, portrait])


def _backbone_inputs(model) -> list:
    """Records (batch shape, registered valid shapes) of each backbone call."""
    calls = []

    def record(_, args):
        calls.append((tuple(args[0].shape), registered_valid_shapes(args[0])))

    model.backbone.register_forward_pre_hook(record)
    return calls


@pytest.mark.parametrize('config, tells_backbone', [(MIXED, True),
                                                    (MIXED_PLAIN, False)])
@pytest.mark.mmcv_ops  # trains Mask R-CNN
def test_train_step_on_padded_batch(repo_root, mixed_coco, config,
                                    tells_backbone):
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(repo_root, config))
    batch = _train_batch(cfg, mixed_coco)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    calls = _backbone_inputs(model)
    before = [p.detach().clone() for p in model.backbone.parameters()]
    log_vars = model.train_step(batch, build_optim_wrapper(model, cfg.optim_wrapper))
    assert all(torch.isfinite(value.detach()).all() for value in log_vars.values())
    assert any(not torch.equal(a, b)
               for a, b in zip(before, model.backbone.parameters()))
    img_shapes = [tuple(sample.img_shape) for sample in batch['data_samples']]
    (batch_shape, valid_shapes), = calls
    height, width = batch_shape[-2:]
    # Both images are padded: one in height, the other in width.
    assert all(h < height or w < width for h, w in img_shapes)
    assert valid_shapes == (img_shapes if tells_backbone else None)


#: The mmsoft code a Mask R-CNN training step runs, relative to the package:
#: the models, their ops, the OpenMMLab adapter (backbone and valid-region
#: data preprocessor) and the helpers they call (SOFT's pooling matrices from
#: deployment/). mmdet's heads sync by design (proposals, NMS, target
#: assignment) and are not counted.
MMSOFT_CODE = ('models/', 'ops/', 'openmmlab/', 'deployment/')


@contextlib.contextmanager
def package_files_run():
    """Collects, while inside, the files of the mmsoft package (relative to
    it, as ``'models/soft.py'``) whose functions run in this thread,
    autograd's CPU backward included."""
    ran = set()
    prefix = PACKAGE_DIR + os.sep  # a real path
    real_path = functools.lru_cache(maxsize=None)(osp.realpath)

    def profile(frame, event, arg):
        if event == 'call':
            path = real_path(frame.f_code.co_filename)
            if path.startswith(prefix):
                ran.add(osp.relpath(path, PACKAGE_DIR).replace(os.sep, '/'))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield ran
    finally:
        sys.setprofile(previous)


@pytest.mark.parametrize('config', [MIXED, UFO_VIT_DEMO])
@pytest.mark.mmcv_ops  # trains Mask R-CNN
def test_mask_rcnn_step_makes_no_host_sync_in_the_backbone(repo_root, mixed_coco,
                                                           config):
    """The demo Mask R-CNNs' training step on a padded batch through the
    configs' valid-region preprocessor; SOFT with the solver a GPU runs
    (``'newton'``)."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(repo_root, config))
    assert cfg.model.data_preprocessor.type == 'ValidRegionDetDataPreprocessor'
    if cfg.model.backbone.type == 'SOFT':
        cfg.model.backbone.solver = 'newton'
    batch = _train_batch(cfg, mixed_coco)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    with HostSyncCounter() as counter, package_files_run() as ran:
        model.train_step(batch, optim_wrapper)
    assert counter.counts, 'the heads sync: the counter must see them'
    # MMSOFT_CODE is what ran: every mmsoft file the step ran is under it,
    # and each of its prefixes holds one that ran.
    model_files = ({'models/soft.py', 'ops/soft.py', 'ops/kernel_inverse.py',
                    'deployment/traceable.py'} if config == MIXED
                   else {'models/ufo_vit.py', 'ops/xnorm.py'})
    assert model_files | {'openmmlab/backbones.py', 'ops/layer_norm.py'} <= ran
    assert sorted(path for path in ran if not path.startswith(MMSOFT_CODE)) == []
    assert counter.in_files(*MMSOFT_CODE) == {}
