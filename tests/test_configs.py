"""The configs under configs/: all parse, all but fragments and demos build
in their own registry scope, and the SOFT++/UFO-ViT dense-prediction
experiments follow the recipe, match the published parameter totals and their
metafiles, and the smallest detector of each family takes a training step.

Each model is built once (module-scoped cache), without the Pretrained
checkpoint, and parameters are counted without running a forward pass.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import functools
import glob
import os.path as osp
import re

import torch
import yaml
from mmengine.config import Config
from mmengine.registry import DefaultScope
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.apis import build_in_scope

pytestmark = pytest.mark.openmmlab

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
FAMILIES = ('soft', 'ufo_vit')


def _rel(path: str) -> str:
    return osp.relpath(path, REPO)


# configs/comparison/peer_backbones.py is the module the peer configs import,
# not a config.
PEER_MODULE = 'configs/comparison/peer_backbones.py'
ALL_CONFIGS = sorted(
    _rel(path) for path in glob.glob(osp.join(REPO, 'configs', '**', '*.py'),
                                     recursive=True) if _rel(path) != PEER_MODULE)
# mmpretrain configs (UFO-ViT's ImageNet pre-training): their mmpretrain::
# bases need mmpretrain, hence torchvision; tests/test_ufo_vit_pretrain.py
# builds and trains them.
PRETRAIN = [path for path in ALL_CONFIGS
            if path.startswith('configs/ufo_vit/pretrain/')]
# Complete configs, each built into a model: all but the fragments in
# `_base_/` folders, the demo configs and the comparison's peer configs
# (configs/demo/, configs/comparison/: parsed only) and the pre-training
# configs.
PARSED_ONLY = ('demo', 'comparison')
BUILDABLE = [path for path in ALL_CONFIGS if '_base_' not in path.split('/')
             and path.split('/')[1] not in PARSED_ONLY
             and path not in PRETRAIN]
# The dense-prediction experiments: configs/<family>/<name>.py (subfolders
# such as configs/ufo_vit/pretrain/ hold other recipes).
EXPERIMENTS = [path for path in BUILDABLE if path.split('/')[1] in FAMILIES
               and path.count('/') == 2]

# The configs the families must provide.
EXPECTED = [f'configs/soft/mask-rcnn_soft++-{s}_fpn_1x_coco.py'
            for s in ('tiny', 'small', 'medium', 'large')]
EXPECTED += [f'configs/soft/mask-rcnn_soft++-{s}_fpn_ms-3x_coco.py'
             for s in ('tiny', 'small')]
EXPECTED += [f'configs/soft/retinanet_soft++-{s}_fpn_1x_coco.py'
             for s in ('tiny', 'small', 'medium', 'large')]
EXPECTED += [f'configs/soft/upernet_soft++-{s}_8xb2-160k_ade20k-512x512.py'
             for s in ('small', 'medium')]
EXPECTED += [f'configs/ufo_vit/mask-rcnn_ufo-vit-{s}_fpn_1x_coco.py'
             for s in ('tiny', 'small', 'medium', 'base')]
EXPECTED += [f'configs/ufo_vit/mask-rcnn_ufo-vit-{s}_fpn_ms-3x_coco.py'
             for s in ('small', 'medium')]
EXPECTED += [f'configs/ufo_vit/upernet_ufo-vit-{s}_8xb2-160k_ade20k-512x512.py'
             for s in ('small', 'medium')]

# Published totals (SOFT: official README, SOFT++ backbones; UFO-ViT: the
# paper) where they describe the architecture these configs build. SOFT++-small
# is left out: the official code's depths (whose checkpoints the config loads)
# give a larger model than the README's 24M backbone.
PUBLISHED_PARAMS = {
    'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py': 33e6,
    'configs/soft/mask-rcnn_soft++-medium_fpn_1x_coco.py': 65e6,
    'configs/soft/mask-rcnn_soft++-large_fpn_1x_coco.py': 84e6,
    'configs/soft/retinanet_soft++-tiny_fpn_1x_coco.py': 23e6,
    'configs/soft/retinanet_soft++-medium_fpn_1x_coco.py': 55e6,
    'configs/soft/retinanet_soft++-large_fpn_1x_coco.py': 74e6,
    'configs/soft/upernet_soft++-medium_8xb2-160k_ade20k-512x512.py': 76e6,
    'configs/ufo_vit/mask-rcnn_ufo-vit-small_fpn_1x_coco.py': 39.7e6,
    'configs/ufo_vit/mask-rcnn_ufo-vit-medium_fpn_1x_coco.py': 56.4e6,
}

DATA_ROOTS = dict(mmdet='data/coco/', mmseg='data/ade/ADEChallengeData2016')
OPTIMIZERS = dict(mmdet=dict(lr=1e-4, weight_decay=0.05),
                  mmseg=dict(lr=6e-5, weight_decay=0.01))


@functools.lru_cache(maxsize=None)
def load(path: str) -> Config:
    """The parsed config, shared by the tests: read it, never change it.

    Parsing is cached because mmengine reads every metafile of mmdet/mmseg
    for each ``mmdet::``/``mmseg::`` base (seconds per config).
    """
    return Config.fromfile(osp.join(REPO, path))


def size_of(path: str) -> str:
    """The size in a config's name: 'tiny' in mask-rcnn_soft++-tiny_fpn_..."""
    return re.search(r'(?:soft\+\+|ufo-vit)-([a-z]+)_', osp.basename(path)).group(1)


def backbone_channels(backbone: torch.nn.Module):
    """Channels of the four output maps of a SOFT or UFOViT backbone."""
    dims = backbone.embed_dims
    return list(dims) if isinstance(dims, (list, tuple)) else [dims] * 4


@pytest.fixture(scope='module')
def built():
    """``built(path) -> (cfg, model)``, each config's model built once."""
    cache = {}

    def get(path):
        if path not in cache:
            cfg = load(path)
            cache[path] = build_in_scope(cfg.default_scope, cfg.model,
                                         pretrained=False)
        return load(path), cache[path]

    return get


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_expected_config_exists():
    assert sorted(EXPERIMENTS) == sorted(EXPECTED)


def unselected(prefixes, paths) -> list:
    """The ``prefixes`` that start none of ``paths``."""
    return [prefix for prefix in prefixes
            if not any(path.startswith(prefix) for path in paths)]


def test_each_selection_selects_configs():
    """The folders and files the lists above select or leave out exist."""
    assert osp.isfile(osp.join(REPO, PEER_MODULE))
    assert unselected(['configs/ufo_vit/pretrain/', 'configs/soft/',
                       *(f'configs/{folder}/' for folder in PARSED_ONLY),
                       *(f'configs/{family}/' for family in FAMILIES)],
                      ALL_CONFIGS) == []
    assert unselected(['configs/demos/'], ALL_CONFIGS) == ['configs/demos/']
    assert PRETRAIN and BUILDABLE
    assert sorted(SOFT_EXPERIMENTS) == sorted(
        path for path in EXPECTED if path.split('/')[1] == 'soft')


@pytest.mark.parametrize('path', [
    pytest.param(path, marks=pytest.mark.torchvision) if path in PRETRAIN else path
    for path in ALL_CONFIGS])
def test_config_parses(path):
    cfg = load(path)
    assert isinstance(cfg, Config)
    # The distributed backend is mmengine's (NCCL on GPUs); on a machine
    # without CUDA, tools/train.py takes gloo
    # (mmsoft.apis.building.setup_cpu_distributed).
    backend = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('backend')
    assert backend in (None, 'nccl'), (path, backend)


@pytest.mark.parametrize('path', EXPERIMENTS)
def test_recipe(path):
    cfg = load(path)
    scope = cfg.default_scope
    assert scope == ('mmseg' if 'upernet' in path else 'mmdet')
    assert cfg.custom_imports == dict(imports=['mmsoft'], allow_failed_imports=False)

    backbone = cfg.model.backbone
    assert backbone.type == ('SOFT' if '/soft/' in path else 'UFOViT')
    assert backbone.arch == size_of(path)
    assert 0 < backbone.drop_path_rate < 0.5
    if backbone.type == 'SOFT':
        # The function the published checkpoints were trained with.
        assert backbone.variant == 'soft++'
        assert backbone.solver == 'newton_closed_form'
        assert backbone.newton_iters == 20
        assert backbone.max_bottleneck_tokens == 256
    # The checkpoint of the same size.
    assert backbone.init_cfg.type == 'Pretrained'
    assert re.search(rf'[_-]{backbone.arch}_', backbone.init_cfg.checkpoint)

    optim = cfg.optim_wrapper
    assert optim.type == 'OptimWrapper' and optim.optimizer.type == 'AdamW'
    for key, value in OPTIMIZERS[scope].items():
        assert optim.optimizer[key] == pytest.approx(value)
    assert optim.paramwise_cfg.norm_decay_mult == 0

    # 8 GPUs x 2 images, whatever the name says.
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)

    dataset = cfg.train_dataloader.dataset
    repeat = dataset.times if dataset.type == 'RepeatDataset' else 1
    dataset = dataset.get('dataset', dataset)
    assert dataset.data_root == DATA_ROOTS[scope]
    assert cfg.test_dataloader.dataset.data_root == DATA_ROOTS[scope]
    if scope == 'mmseg':
        assert cfg.train_cfg.max_iters == 160000
        assert cfg.model.data_preprocessor.size == (512, 512)
        assert cfg.param_scheduler[-1].end == 160000
        # The base's SGD floor (eta_min 1e-4) would exceed AdamW's 6e-5.
        assert cfg.param_scheduler[-1].eta_min < optim.optimizer.lr
    else:
        epochs = cfg.train_cfg.max_epochs * repeat
        assert epochs == (36 if 'ms-3x' in path else 12)
        steps = [m * repeat for m in cfg.param_scheduler[-1].milestones]
        assert steps == ([27, 33] if 'ms-3x' in path else [8, 11])
        if 'ms-3x' in path:
            resize = [t for t in dataset.pipeline if t.type == 'RandomResize']
            assert resize and len(resize[0].scale) == 2


# mmdet/mmseg models need mmcv's compiled ops (the floor env's mmcv-lite has
# none).
@pytest.mark.mmcv_ops
@pytest.mark.parametrize('path', BUILDABLE)
def test_builds_in_its_scope(path, built):
    _, model = built(path)
    assert num_params(model) > 0


@pytest.mark.parametrize('path', EXPERIMENTS)
@pytest.mark.mmcv_ops  # builds mmdet/mmseg models
def test_neck_and_head_channels_match_backbone(path, built):
    cfg, model = built(path)
    channels = backbone_channels(model.backbone)
    if cfg.default_scope == 'mmdet':
        assert list(model.neck.in_channels) == channels
    else:
        assert list(model.decode_head.in_channels) == channels
        assert model.auxiliary_head.in_channels == channels[2]
        assert model.decode_head.num_classes == 150


@pytest.mark.parametrize('path', EXPERIMENTS)
@pytest.mark.mmcv_ops  # builds mmdet/mmseg models
def test_no_weight_decay_on_norms_embeddings_and_scales(path, built):
    from mmengine.optim import build_optim_wrapper
    cfg, model = built(path)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {}
    for group in optim_wrapper.optimizer.param_groups:
        for param in group['params']:
            decay[id(param)] = group['weight_decay']
    names = dict(model.named_parameters())
    if model.backbone.__class__.__name__ == 'SOFT':
        free = [n for n in names if n.endswith(('.pos_embed', '.cls_token'))]
    else:
        free = [n for n in names if re.search(r'\.gamma(\d|_q|_kv)$', n)
                or '.pos_embed.' in n]
    free += [n for n, m in model.backbone.named_modules()
             if isinstance(m, (torch.nn.LayerNorm, _BatchNorm))
             for n in (f'backbone.{n}.weight', f'backbone.{n}.bias')]
    assert len(free) > 4
    assert all(decay[id(names[n])] == 0 for n in free)
    weight_decay = cfg.optim_wrapper.optimizer.weight_decay
    linear = [m.weight for m in model.backbone.modules()
              if isinstance(m, torch.nn.Linear)]
    assert linear and all(decay[id(p)] == weight_decay for p in linear)


@pytest.mark.parametrize('path, published', sorted(PUBLISHED_PARAMS.items()))
@pytest.mark.mmcv_ops  # builds mmdet/mmseg models
def test_parameter_totals_near_published(path, published, built):
    _, model = built(path)
    assert abs(num_params(model) - published) / published < 0.10


@pytest.mark.parametrize('path', [
    'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py',
    'configs/ufo_vit/mask-rcnn_ufo-vit-tiny_fpn_1x_coco.py',
])
@pytest.mark.mmcv_ops  # trains Mask R-CNN
def test_smallest_detector_trains_one_step(path, built):
    from tests.helpers.dense_models import backbone_grad_norm, detector_train_step
    cfg, model = built(path)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model.init_weights()
        # One image: the cost is Mask R-CNN's heads (512 sampled RoIs each).
        losses = detector_train_step(model, size=(64, 96), batch_size=1)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0


@pytest.mark.mmcv_ops  # builds mmdet/mmseg models
def test_metafiles_and_model_index_list_every_experiment(built):
    with open(osp.join(REPO, 'model-index.yml')) as f:
        imports = yaml.safe_load(f)['Import']
    assert sorted(imports) == [f'configs/{family}/metafile.yml' for family in FAMILIES]
    listed = []
    for metafile in imports:
        with open(osp.join(REPO, metafile)) as f:
            meta = yaml.safe_load(f)
        collections = {c['Name'] for c in meta['Collections']}
        for model in meta['Models']:
            assert model['In Collection'] in collections
            assert model['Name'] == osp.splitext(osp.basename(model['Config']))[0]
            assert osp.isfile(osp.join(REPO, model['Config']))
            # Measured on the built model; the family README shows it too.
            _, built_model = built(model['Config'])
            assert model['Metadata']['Parameters'] == num_params(built_model), \
                f"update Parameters of {model['Name']} in {metafile} and README"
            listed.append(model['Config'])
    assert sorted(listed) == sorted(EXPERIMENTS)


@pytest.mark.parametrize('family', FAMILIES)
def test_readme_has_a_row_per_config(family):
    with open(osp.join(REPO, 'configs', family, 'README.md')) as f:
        readme = f.read()
    for path in EXPERIMENTS:
        if path.split('/')[1] == family:
            assert osp.basename(path) in readme


# --------------------------------------------------------------------------
# Bottleneck pooling: the same in training and testing
# --------------------------------------------------------------------------
SOFT_EXPERIMENTS = [path for path in EXPERIMENTS if path.startswith('configs/soft/')]


def bottleneck_grids(image_hw, sr_ratios=(8, 4, 2)):
    """The bottleneck grid of each SOFT attention stage for an H x W input:
    stage i's token grid is ceil(side / 2^(i+2)), its bottleneck grid that
    divided by the stage's stride r (a stride-r convolution)."""
    return [tuple(-(-side // 2**(i + 2)) // ratio for side in image_hw)
            for i, ratio in enumerate(sr_ratios)]


def is_pooled(image_hw, cap):
    """Whether the cap pools the bottleneck grid of every stage (True), of
    none (False); raises if it pools some stages but not others."""
    from mmsoft.models.soft import capped_grid_size
    pooled = {capped_grid_size(*grid, cap) != grid
              for grid in bottleneck_grids(image_hw)}
    assert len(pooled) == 1, (image_hw, cap)
    return pooled.pop()


def resized_shapes(scale, aspect_ratios=(4 / 3, 3 / 4, 1.0, 2.0)):
    """Image shapes (H, W) after mmdet's keep-ratio Resize to ``scale``
    (long, short) of images of the given width/height ratios."""
    long_side, short_side = max(scale), min(scale)
    shapes = []
    for ratio in aspect_ratios:
        width, height = 1000 * ratio, 1000
        factor = min(long_side / max(width, height), short_side / min(width, height))
        shapes.append((round(height * factor), round(width * factor)))
    return shapes


@pytest.mark.parametrize('path', SOFT_EXPERIMENTS)
def test_training_and_testing_pool_the_bottleneck_alike(path):
    cfg = load(path)
    cap = cfg.model.backbone.max_bottleneck_tokens
    if cfg.default_scope == 'mmseg':
        # Training crops and test windows are the same size and never pooled.
        crop = cfg.model.data_preprocessor.size
        assert cfg.model.test_cfg.mode == 'slide'
        assert tuple(cfg.model.test_cfg.crop_size) == tuple(crop)
        assert not is_pooled(crop, cap)
        # A smaller window (an image side below 512) is not pooled either.
        assert not is_pooled((crop[0], crop[1] // 2), cap)
        return
    train = cfg.train_dataloader.dataset
    train = train.get('dataset', train)
    scales = []
    for transform in train.pipeline:
        if transform.type == 'Resize':
            scales.append(transform.scale)
        elif transform.type == 'RandomResize':
            scales.extend(transform.scale)
    test_scales = [t.scale for t in cfg.test_dataloader.dataset.pipeline
                   if t.type == 'Resize']
    assert scales and test_scales
    # Every training scale and the test scale pool every stage's grid.
    for scale in scales + test_scales:
        for shape in resized_shapes(scale):
            assert is_pooled(shape, cap), (scale, shape)
