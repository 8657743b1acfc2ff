"""ImageNet pre-training path of UFO-ViT, end to end on generated data.

Pre-training (mmengine ``Runner`` on the demo classification config) ->
``tools/model_converters/ufo_vit_cls2backbone.py`` -> Mask R-CNN with
``init_cfg=dict(type='Pretrained', checkpoint=...)`` and one detection
training step; plus the converter's errors, the head, the batch
augmentations, the dataset and the ImageNet configs.
"""
import importlib.util
import math
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DATASETS, MODELS
from mmengine.structures import BaseDataElement

import mmsoft  # noqa: F401  (registers the backbones)
import mmsoft.pretrain  # noqa: F401  (classifier, head, data, metric)
from mmsoft.pretrain import (RandAugment, RandomErasing, RandomResizedCrop, ResizeEdge,
                             mix_batch)
from mmsoft.pretrain.demo_data import generate_classification_demo
from mmsoft.models.backbones import SOFT, UFOViT
from mmsoft.models.backbones.ufo_vit import ARCH_SETTINGS
from mmsoft.pretrain.cls_to_backbone import ufo_vit_cls_to_backbone
from mmsoft.pretrain.head import ClassAttentionHead
from mmsoft.pretrain.losses import soft_cross_entropy
from mmsoft.testing import backbone_grad_norm, build_mask_rcnn, detector_train_step

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PRETRAIN_DIR = osp.join(REPO, 'configs', 'ufo_vit', 'pretrain')
DEMO_CONFIG = osp.join(PRETRAIN_DIR, 'ufo-vit-tiny_demo_cls.py')
SIZES = ('tiny', 'small', 'medium', 'base')
NUM_TRAIN, NUM_VAL, BATCH = 32, 8, 8
# Keys of UFOViT's stride-4/8 output branches, absent from a classifier.
PYRAMID_KEYS = [
    'pyramid.branches.0.0.bias', 'pyramid.branches.0.0.weight',
    'pyramid.branches.0.1.bias', 'pyramid.branches.0.1.num_batches_tracked',
    'pyramid.branches.0.1.running_mean', 'pyramid.branches.0.1.running_var',
    'pyramid.branches.0.1.weight', 'pyramid.branches.0.3.bias',
    'pyramid.branches.0.3.weight', 'pyramid.branches.1.bias',
    'pyramid.branches.1.weight'
]


def _load_tool():
    path = osp.join(REPO, 'tools', 'model_converters', 'ufo_vit_cls2backbone.py')
    spec = importlib.util.spec_from_file_location('ufo_vit_cls2backbone', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


converter_tool = _load_tool()


@pytest.fixture(scope='module')
def cls_data(tmp_path_factory) -> str:
    """32 training and 8 validation 64x64 images of 4 shape classes."""
    root = str(tmp_path_factory.mktemp('demo_cls'))
    generate_classification_demo(root, num_train=NUM_TRAIN, num_val=NUM_VAL, seed=3)
    return root


def demo_config(data_root: str, work_dir: str) -> Config:
    """The demo config, shrunk to one epoch of 4 iterations at constant lr."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.work_dir = work_dir
    for split in ('train', 'val', 'test'):
        loader = cfg[f'{split}_dataloader']
        loader.dataset.data_root = data_root
        loader.update(batch_size=BATCH, num_workers=0, persistent_workers=False)
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1, val_interval=1)
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = 1
    return cfg


@pytest.fixture(scope='module')
def pretrained(cls_data, tmp_path_factory):
    """Runs the demo pre-training; returns the runner and its checkpoint path."""
    from mmengine.runner import Runner
    work_dir = str(tmp_path_factory.mktemp('pretrain'))
    runner = Runner.from_cfg(demo_config(cls_data, work_dir))
    runner.train()
    return runner, osp.join(work_dir, 'epoch_1.pth')


@pytest.fixture(scope='module')
def converted(pretrained, tmp_path_factory):
    """The tool's output for the pre-training checkpoint."""
    _, src = pretrained
    dst = str(tmp_path_factory.mktemp('converted') / 'ufo-vit-tiny_demo.pth')
    assert converter_tool.main([src, dst]) == 0
    return src, dst


# ----------------------------------------------------------- end to end ---
def test_pretraining_runs_and_logs(pretrained):
    runner, ckpt = pretrained
    hub = runner.message_hub
    assert math.isfinite(hub.get_scalar('train/loss').current())
    top1 = hub.get_scalar('val/accuracy/top1').current()
    assert 0 <= top1 <= 100 and (top1 * NUM_VAL / 100) % 1 == pytest.approx(0)
    checkpoint = torch.load(ckpt, map_location='cpu')
    assert checkpoint['meta']['epoch'] == 1
    assert checkpoint['meta']['iter'] == NUM_TRAIN // BATCH
    assert checkpoint['meta']['dataset_meta']['classes'] == (
        'circle', 'square', 'star', 'triangle')
    state = checkpoint['state_dict']
    # The layer scales start at 1e-5 and moved during the 4 AdamW steps.
    assert (state['backbone.blocks.0.gamma1'] - 1e-5).abs().max() > 1e-4
    assert state['head.fc.weight'].shape == (4, 192)


def test_converter_output(converted):
    src, dst = converted
    classifier = torch.load(src, map_location='cpu')['state_dict']
    result = torch.load(dst, map_location='cpu', weights_only=True)
    state, meta = result['state_dict'], result['meta']
    prefix = 'backbone.'
    backbone_keys = {k[len(prefix):] for k in classifier if k.startswith(prefix)}
    assert set(state) == backbone_keys and len(state) == 366
    for key, value in state.items():
        assert torch.equal(value, classifier['backbone.' + key]), key
    assert meta['arch'] == 'tiny'
    assert meta['arch_settings'] == dict(ARCH_SETTINGS['tiny'], mlp_ratio=4,
                                         lpi_kernel_size=3, pos_hidden_dims=32)
    assert meta['not_pretrained'] == PYRAMID_KEYS
    assert meta['num_dropped'] == sum(not k.startswith('backbone.') for k in classifier)
    assert meta['source_epoch'] == 1 and meta['source_iter'] == NUM_TRAIN // BATCH


@pytest.mark.mmcv_ops  # trains Mask R-CNN
def test_pretrained_mask_rcnn_loads_and_trains(converted):
    _, dst = converted
    weights = torch.load(dst, map_location='cpu')['state_dict']
    backbone = dict(type='UFOViT', arch='tiny', drop_path_rate=0.05,
                    init_cfg=dict(type='Pretrained', checkpoint=dst))
    model = build_mask_rcnn(backbone, [192] * 4)
    loaded = model.backbone.state_dict()
    assert sorted(set(loaded) - set(weights)) == PYRAMID_KEYS
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key
    losses = detector_train_step(model, size=(64, 64), batch_size=2)
    assert all(math.isfinite(v) for v in losses.values()), losses
    assert losses['loss'] > 0
    assert backbone_grad_norm(model) > 0


# ------------------------------------------------------------- converter ---
def _classifier_state(backbone: torch.nn.Module) -> dict:
    state = {f'backbone.{k}': v for k, v in backbone.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(4, 8)
    state['head.fc.bias'] = torch.zeros(4)
    return state


def test_converter_rejects_foreign_checkpoint(tmp_path, capsys):
    src = str(tmp_path / 'soft_cls.pth')
    torch.save({'state_dict': _classifier_state(SOFT(arch='tiny'))}, src)
    assert converter_tool.main([src, str(tmp_path / 'out.pth')]) == 1
    err = capsys.readouterr().err
    assert 'not a UFO-ViT backbone: missing keys: blocks.0.attn.gamma_q' in err
    assert 'unexpected keys: ' in err and 'patch_embeds.0.proj.0.weight' in err
    assert not osp.exists(tmp_path / 'out.pth')


def test_converter_lists_missing_and_unexpected_keys():
    state = _classifier_state(UFOViT(arch=dict(embed_dims=32, depth=4, num_heads=2),
                                     out_indices=(3, )))
    del state['backbone.blocks.2.ffn.fc2.bias']
    state['backbone.blocks.1.extra.weight'] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        ufo_vit_cls_to_backbone({'state_dict': state})
    message = str(info.value)
    assert 'missing keys: blocks.2.ffn.fc2.bias;' in message
    assert 'unexpected keys: blocks.1.extra.weight.' in message

    state = _classifier_state(UFOViT(arch=dict(embed_dims=32, depth=4, num_heads=2)))
    state['backbone.blocks.0.norm3.weight'] = torch.zeros(5)
    with pytest.raises(ValueError, match=r'blocks.0.norm3.weight: \(5,\) '
                       r'\(expected \(32,\)\)'):
        ufo_vit_cls_to_backbone({'state_dict': state})
    with pytest.raises(ValueError, match="no tensors under 'backbone.'"):
        ufo_vit_cls_to_backbone({'state_dict': {'head.fc.weight': torch.zeros(2)}})


def test_converter_detects_custom_arch():
    arch = dict(embed_dims=48, depth=5, num_heads=3, mlp_ratio=2, lpi_kernel_size=5,
                pos_hidden_dims=8)
    state = _classifier_state(UFOViT(arch=arch, in_channels=4, qkv_bias=False))
    wrapped = {'module.' + k: v for k, v in state.items()}  # DDP prefix
    backbone, info = ufo_vit_cls_to_backbone(wrapped)
    assert info['arch'] is None and info['arch_settings'] == arch
    assert info['in_channels'] == 4 and info['qkv_bias'] is False
    assert info['not_pretrained'] == [] and info['dropped'] == [
        'module.head.fc.bias', 'module.head.fc.weight']
    model = UFOViT(arch=arch, in_channels=4, qkv_bias=False)
    model.load_state_dict(backbone, strict=True)


# ---------------------------------------------------------- head, losses ---
def test_soft_cross_entropy_matches_torch():
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    expected = F.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.allclose(soft_cross_entropy(logits, labels, 0.1), expected)
    assert torch.allclose(soft_cross_entropy(logits, F.one_hot(labels, 5).float(), 0.1),
                          expected)
    assert float(soft_cross_entropy(torch.zeros(2, 4), torch.tensor([1, 2]))) == \
        pytest.approx(math.log(4))


def test_class_attention_head():
    torch.manual_seed(0)
    head = ClassAttentionHead(num_classes=7, in_channels=32, num_layers=2, num_heads=4,
                              layer_scale_init_value=0.5)
    head.init_weights()
    head.eval()
    feats = torch.randn(3, 32, 4, 5)
    logits = head((feats, ))
    assert logits.shape == (3, 7)
    # Class attention pools the tokens: their order does not matter.
    tokens = feats.flatten(2).transpose(1, 2)
    shuffled = tokens[:, torch.randperm(20)]
    assert torch.allclose(head(shuffled), logits, atol=1e-5)
    # The tokens are used: changing one changes the logits.
    tokens[:, 0] += torch.randn(32)
    assert not torch.allclose(head(tokens), logits, atol=1e-4)

    pooling = ClassAttentionHead(num_classes=7, in_channels=32, num_layers=0)
    expected = pooling.fc(pooling.norm(feats.mean(dim=(2, 3))))
    assert torch.allclose(pooling(feats), expected)
    samples = [BaseDataElement(gt_label=torch.tensor([i])) for i in (0, 3, 6)]
    losses = pooling.loss(feats, samples)
    assert torch.allclose(losses['loss'], F.cross_entropy(
        expected, torch.tensor([0, 3, 6]), label_smoothing=0.1))
    predicted = pooling.predict(feats)
    assert [int(p.pred_label) for p in predicted] == expected.argmax(-1).tolist()


def test_classifier_reads_stride16_tokens():
    cfg = Config.fromfile(DEMO_CONFIG).model
    with_skip = MODELS.build(cfg)
    without = MODELS.build(dict(cfg, skip_final_pool=False))
    images = torch.randn(2, 3, 64, 64)
    assert with_skip.extract_feat(images)[-1].shape == (2, 192, 4, 4)
    assert without.extract_feat(images)[-1].shape == (2, 192, 2, 2)
    assert list(with_skip.state_dict()) == list(without.state_dict())
    with pytest.raises(ValueError, match='single resampled output'):
        MODELS.build(dict(cfg, backbone=dict(cfg.backbone, out_indices=(2, 3))))


# --------------------------------------------------------- augmentations ---
def test_mixup_and_cutmix():
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16)
    targets = F.one_hot(torch.tensor([0, 1, 2, 3]), 4).float()
    np.random.seed(0)
    mixed, mixed_targets, lam, mode = mix_batch(images, targets, 0.8, 0., 0.5, 1.0)
    assert mode == 'mixup' and 0 < lam < 1
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.flip(0))
    assert torch.allclose(mixed_targets.sum(1), torch.ones(4))
    assert mixed_targets[0, 0] == pytest.approx(lam)
    assert mixed_targets[0, 3] == pytest.approx(1 - lam)

    np.random.seed(1)
    mixed, mixed_targets, lam, mode = mix_batch(images, targets, 0., 1.0, 0.5, 1.0)
    assert mode == 'cutmix'
    kept = (mixed == images).all(dim=1).float().mean(dim=(1, 2))
    assert torch.allclose(kept, torch.full((4, ), lam))
    assert torch.allclose(mixed_targets[:, 0], torch.tensor([lam, 0, 0, 1 - lam]))
    _, same, lam, mode = mix_batch(images, targets, 0.8, 1.0, 0.5, prob=0.0)
    assert mode == 'none' and lam == 1.0 and torch.equal(same, targets)


def test_preprocessor_normalises_erases_and_mixes():
    cfg = dict(type='ClsDataPreprocessor', num_classes=3,
               mean=[10., 20., 30.], std=[2., 4., 5.], to_rgb=True)
    image = torch.stack([torch.full((8, 8), v, dtype=torch.uint8)
                         for v in (30, 20, 10)])
    samples = [BaseDataElement(gt_label=torch.tensor([i])) for i in range(2)]
    plain = MODELS.build(cfg)
    out = plain(dict(inputs=[image, image], data_samples=samples), training=True)
    assert out['inputs'].shape == (2, 3, 8, 8)
    assert torch.equal(out['inputs'], torch.zeros(2, 3, 8, 8))  # BGR -> RGB
    np.random.seed(0)
    # Erasing is a pipeline transform (mmpretrain's RandomErasing), mixing
    # the preprocessor's batch augmentation.
    erase = RandomErasing(erase_prob=1.0, mode='rand', min_area_ratio=0.02,
                          max_area_ratio=1 / 3, fill_color=(10, 20, 30),
                          fill_std=(5, 4, 2))
    erased_images = [torch.from_numpy(erase(dict(
        img=image.permute(1, 2, 0).numpy().copy()))['img']).permute(2, 0, 1)
        for _ in range(2)]
    augmenting = MODELS.build(dict(
        cfg, batch_augments=dict(augments=[dict(type='Mixup', alpha=0.8)])))
    out = augmenting(dict(inputs=erased_images, data_samples=samples), training=True)
    erased = (out['inputs'] != 0).any(dim=1).float().mean(dim=(1, 2))
    assert ((erased >= 0.02) & (erased <= 0.5)).all()
    scores = torch.stack([s.gt_score for s in out['data_samples']])
    assert torch.allclose(scores.sum(1), torch.ones(2))
    assert scores[0, 0] == pytest.approx(1 - float(scores[0, 1]))


def test_transforms_shapes():
    np.random.seed(0)
    img = np.random.randint(0, 256, (40, 60, 3), dtype=np.uint8)
    out = RandomResizedCrop(32)(dict(img=img))
    assert out['img'].shape == (32, 32, 3) and out['img_shape'] == (32, 32)
    top, left, height, width = RandomResizedCrop(32).crop_box(40, 60)
    assert 0 <= top <= 40 - height and 0 <= left <= 60 - width
    assert 0.08 * 2400 * 0.8 <= height * width <= 2400
    out = ResizeEdge(20)(dict(img=img))
    assert out['img'].shape == (20, 30, 3)
    augment = RandAugment('timm_increasing', num_policies=3, magnitude_level=9,
                          hparams=dict(prob=1.0))
    assert len(augment.sample()) == 3
    out = augment(dict(img=img.copy()))
    assert out['img'].shape == img.shape and out['img'].dtype == np.uint8
    assert not np.array_equal(out['img'], img)


# ------------------------------------------------------ dataset, configs ---
def test_dataset_folder_and_list_file_agree(cls_data):
    by_folder = DATASETS.build(dict(type='CustomDataset', data_root=cls_data,
                                    data_prefix='train'))
    by_list = DATASETS.build(dict(type='CustomDataset', data_root=cls_data,
                                  data_prefix=dict(img_path='val'),
                                  ann_file='meta/val.txt', classes='meta/classes.txt'))
    assert len(by_folder) == NUM_TRAIN and len(by_list) == NUM_VAL
    classes = ('circle', 'square', 'star', 'triangle')
    assert by_folder.metainfo['classes'] == classes == by_list.metainfo['classes']
    labels = [by_folder.get_data_info(i)['gt_label'] for i in range(NUM_TRAIN)]
    assert np.bincount(labels).tolist() == [NUM_TRAIN // 4] * 4
    info = by_list.get_data_info(1)
    assert info['gt_label'] == 1 and info['img_path'].endswith('square/000034.png')


@pytest.mark.parametrize('size', SIZES)
def test_imagenet_configs(size):
    cfg = Config.fromfile(osp.join(PRETRAIN_DIR, f'ufo-vit-{size}_8xb128-300e_in1k.py'))
    arch = ARCH_SETTINGS[size]
    assert cfg.default_scope == 'mmengine'
    assert cfg.model.backbone.arch == size and cfg.model.backbone.out_indices == (3, )
    assert cfg.model.head.in_channels == arch['embed_dims']
    assert arch['embed_dims'] % cfg.model.head.num_heads == 0
    assert cfg.model.head.num_classes == cfg.model.data_preprocessor.num_classes == 1000
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(
        5e-4 * cfg.auto_scale_lr.base_batch_size / 512)
    assert cfg.auto_scale_lr.base_batch_size == 8 * cfg.train_dataloader.batch_size
    assert cfg.train_cfg.max_epochs == 300 and cfg.param_scheduler[0].end == 5


def test_imagenet_pipeline_and_model_on_demo_data(cls_data):
    cfg = Config.fromfile(osp.join(PRETRAIN_DIR, 'ufo-vit-small_8xb128-300e_in1k.py'))
    for split in ('train', 'val'):
        dataset = DATASETS.build(dict(cfg[f'{split}_dataloader'].dataset,
                                      data_root=cls_data))
        item = dataset[0]
        assert item['inputs'].shape == (3, 224, 224)
        assert item['inputs'].dtype == torch.uint8
        assert int(item['data_samples'].gt_label) == 0
    model = MODELS.build(cfg.model)
    model.eval()
    batch = model.data_preprocessor(dict(inputs=[item['inputs']],
                                         data_samples=[item['data_samples']]))
    with torch.no_grad():
        predicted = model(**batch, mode='predict')
    assert predicted[0].pred_score.shape == (1000, )
    assert float(predicted[0].pred_score.sum()) == pytest.approx(1, abs=1e-5)
