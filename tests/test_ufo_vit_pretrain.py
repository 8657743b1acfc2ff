"""UFO-ViT pre-training through mmpretrain, end to end on generated data.

mmpretrain's own ``tools/train.py`` and ``tools/test.py`` (subprocesses) on
the demo classification config -> ``tools/model_converters/
ufo_vit_cls2backbone.py`` -> ``UFOViT`` (and Mask R-CNN, with mmcv's ops)
with ``init_cfg=dict(type='Pretrained', checkpoint=...)``; plus what
mmsoft.pretrain adds to mmpretrain (the class-attention head against timm's
XCiT, the stride-16 UFO-ViT against UFOViT), the converter's errors and the
ImageNet configs.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import importlib.util
import math
import os
import os.path as osp
import pickle
import re
import subprocess
import sys
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope

# mmpretrain and timm import torchvision, which the floor environment lacks
# (it deselects this module with -m "not torchvision").
pytestmark = [pytest.mark.openmmlab, pytest.mark.torchvision]
pytest.importorskip('torchvision')

import mmpretrain  # noqa: E402
from mmpretrain.registry import DATASETS, MODELS  # noqa: E402
from mmpretrain.structures import DataSample  # noqa: E402
from timm.models.xcit import \
    ClassAttentionBlock as TimmClassAttentionBlock  # noqa: E402

import mmsoft  # noqa: E402,F401  (registers UFOViT)
from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.models.ufo_vit import ARCH_SETTINGS
from mmsoft.models.ufo_vit import ClassAttentionBlock  # noqa: E402
from mmsoft.pretrain import UFOViTClassAttentionHead, UFOViTStride16  # noqa: E402
from demo_data import generate_classification_demo  # noqa: E402
from tests.helpers.dense_models import (  # noqa: E402
    backbone_grad_norm, build_mask_rcnn, detector_train_step)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PRETRAIN_DIR = osp.join(REPO, 'configs', 'ufo_vit', 'pretrain')
DEMO_CONFIG = osp.join(PRETRAIN_DIR, 'ufo-vit-tiny_demo_cls.py')
MMPRETRAIN_TOOLS = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools')
SIZES = ('tiny', 'small', 'medium', 'base')
CLASSES = ('circle', 'square', 'star', 'triangle')
NUM_TRAIN, NUM_VAL, BATCH = 32, 8, 8
NUM_ITERS = NUM_TRAIN // BATCH
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


def build(registry, cfg):
    """Builds ``cfg`` in mmpretrain's scope, as the configs do, whatever scope
    earlier tests left current."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return registry.build(cfg)


def class_attention_head(**kwargs) -> UFOViTClassAttentionHead:
    """The head built in mmpretrain's scope, where its loss config resolves,
    whatever scope earlier tests left current."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return UFOViTClassAttentionHead(**kwargs)


def run_mmpretrain_tool(tool: str, *args: str, cwd: str) -> str:
    """Runs mmpretrain's ``tools/<tool>`` on this Python, with one intra-op
    thread (see :func:`one_thread`); returns its output."""
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO,
                                                        os.environ.get('PYTHONPATH')])))
    proc = subprocess.run([sys.executable, osp.join(MMPRETRAIN_TOOLS, tool), *args],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{tool} failed:\n{output[-4000:]}'
    return output


def loader_options(data_root: str, splits=('train', 'val', 'test')) -> list:
    """``--cfg-options`` for batches of 8 from ``data_root``, in the process."""
    options = []
    for split in splits:
        options += [f'{split}_dataloader.dataset.data_root={data_root}',
                    f'{split}_dataloader.batch_size={BATCH}',
                    f'{split}_dataloader.num_workers=0',
                    f'{split}_dataloader.persistent_workers=False']
    return options


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """One intra-op thread here too (as in the tools' subprocesses): with
    another busy process on a 2-core machine, two threads slow these small
    models down many times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def cls_data(tmp_path_factory) -> str:
    """32 training and 8 validation 64x64 images of 4 shape classes."""
    root = str(tmp_path_factory.mktemp('demo_cls'))
    generate_classification_demo(root, num_train=NUM_TRAIN, num_val=NUM_VAL, seed=3)
    return root


@pytest.fixture(scope='module')
def pretrained(cls_data, tmp_path_factory):
    """mmpretrain's train.py on the demo config: one epoch of 4 iterations,
    then validation. Returns the work dir and the tool's output."""
    work_dir = str(tmp_path_factory.mktemp('pretrain'))
    output = run_mmpretrain_tool(
        'train.py', DEMO_CONFIG, '--work-dir', work_dir, '--cfg-options',
        *loader_options(cls_data), 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
        'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=1',
        cwd=work_dir)
    return work_dir, output


@pytest.fixture(scope='module')
def tested(cls_data, pretrained):
    """mmpretrain's test.py on the checkpoint; its output and predictions."""
    work_dir, _ = pretrained
    preds_file = osp.join(work_dir, 'preds.pkl')
    output = run_mmpretrain_tool(
        'test.py', DEMO_CONFIG, osp.join(work_dir, 'epoch_1.pth'), '--work-dir',
        osp.join(work_dir, 'test'), '--out', preds_file, '--cfg-options',
        *loader_options(cls_data, ('test', )), cwd=work_dir)
    with open(preds_file, 'rb') as file:
        predictions = pickle.load(file)
    return output, predictions


@pytest.fixture(scope='module')
def converted(pretrained, tmp_path_factory):
    """The converter's output for the pre-training checkpoint."""
    work_dir, _ = pretrained
    src = osp.join(work_dir, 'epoch_1.pth')
    dst = str(tmp_path_factory.mktemp('converted') / 'ufo-vit-tiny_demo.pth')
    assert converter_tool.main([src, dst]) == 0
    return src, dst


def demo_model(state_dict: dict) -> nn.Module:
    """The demo config's ImageClassifier with ``state_dict``, in eval mode."""
    cfg = Config.fromfile(DEMO_CONFIG)
    model = build(MODELS, dict(cfg.model, data_preprocessor=dict(
        cfg.data_preprocessor, type='ClsDataPreprocessor')))
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


# ----------------------------------------------------------- end to end ---
def test_train_tool_trains_validates_and_saves(pretrained):
    work_dir, output = pretrained
    losses = re.findall(r'Epoch\(train\) \[1\]\[(\d)/4\].*?loss: ([\d.]+)', output)
    assert [int(i) for i, _ in losses] == list(range(1, NUM_ITERS + 1))
    assert all(0 < float(loss) < 10 for _, loss in losses)
    top1 = float(re.search(r'Epoch\(val\) \[1\]\[1/1\]\s+accuracy/top1: ([\d.]+)',
                           output).group(1))
    assert 0 <= top1 <= 100 and (top1 * NUM_VAL / 100) % 1 == pytest.approx(0)
    assert osp.isfile(osp.join(work_dir, 'best_accuracy_top1_epoch_1.pth'))

    checkpoint = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu')
    assert checkpoint['meta']['epoch'] == 1
    assert checkpoint['meta']['iter'] == NUM_ITERS
    assert checkpoint['meta']['dataset_meta']['classes'] == CLASSES
    state, raw = checkpoint['state_dict'], checkpoint['ema_state_dict']
    assert {key.split('.')[0] for key in state} == {'backbone', 'head'}
    assert state['head.fc.weight'].shape == (4, 192)
    # EMAHook: state_dict holds the average, ema_state_dict the trained weights.
    assert int(raw['steps']) == NUM_ITERS
    assert set(raw) == {'steps'} | {f'module.{key}' for key in state}
    gamma = 'backbone.blocks.0.gamma1'
    # The layer scales start at 1e-5 and moved during the 4 AdamW steps.
    assert (raw[f'module.{gamma}'] - 1e-5).abs().max() > 1e-4
    assert not torch.allclose(state[gamma], raw[f'module.{gamma}'])


def test_test_tool_evaluates_the_ema_weights(tested, pretrained, cls_data):
    output, predictions = tested
    top1 = float(re.search(r'Epoch\(test\) \[1/1\]\s+accuracy/top1: ([\d.]+)',
                           output).group(1))
    assert len(predictions) == NUM_VAL
    correct = [int(p['pred_label']) == int(p['gt_label']) for p in predictions]
    assert top1 == pytest.approx(100 * sum(correct) / NUM_VAL)

    # The scores are those of the checkpoint's state_dict (the EMA weights),
    # not of the trained weights.
    work_dir, _ = pretrained
    checkpoint = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu')
    raw = {key[len('module.'):]: value
           for key, value in checkpoint['ema_state_dict'].items() if key != 'steps'}
    cfg = Config.fromfile(DEMO_CONFIG)
    dataset = build(DATASETS, dict(cfg.test_dataloader.dataset, data_root=cls_data))
    items = [dataset[i] for i in range(NUM_VAL)]
    scores = {}
    for name, weights in (('ema', checkpoint['state_dict']), ('raw', raw)):
        model = demo_model(weights)
        batch = model.data_preprocessor(dict(
            inputs=[item['inputs'] for item in items],
            data_samples=[item['data_samples'] for item in items]))
        with torch.no_grad():
            scores[name] = torch.stack(
                [p.pred_score for p in model(**batch, mode='predict')])
    dumped = torch.stack([p['pred_score'] for p in sorted(
        predictions, key=lambda p: p['sample_idx'])])
    assert torch.allclose(scores['ema'], dumped, atol=1e-5)
    assert (scores['raw'] - dumped).abs().max() > 1e-4


def test_converter_output(converted):
    src, dst = converted
    classifier = torch.load(src, map_location='cpu')['state_dict']
    result = torch.load(dst, map_location='cpu', weights_only=True)
    state, meta = result['state_dict'], result['meta']
    prefix = 'backbone.'
    backbone_keys = {k[len(prefix):] for k in classifier if k.startswith(prefix)}
    assert set(state) == backbone_keys and len(state) == 366
    for key, value in state.items():
        assert torch.equal(value, classifier[prefix + key]), key
    assert meta['arch'] == 'tiny' and meta['ema'] is True
    assert meta['arch_settings'] == dict(ARCH_SETTINGS['tiny'], mlp_ratio=4,
                                         local_kernel_size=3, pos_hidden_dims=32)
    assert meta['not_pretrained'] == PYRAMID_KEYS
    assert meta['num_dropped'] == sum(not k.startswith(prefix) for k in classifier)
    assert meta['source_epoch'] == 1 and meta['source_iter'] == NUM_ITERS


def test_ufo_vit_loads_the_converted_checkpoint(converted):
    _, dst = converted
    weights = torch.load(dst, map_location='cpu')['state_dict']
    model = UFOViT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=dst))
    model.init_weights()
    loaded = model.state_dict()
    assert sorted(set(loaded) - set(weights)) == PYRAMID_KEYS
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key


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
    assert 'unexpected keys: ' in err and 'stages.0.patch_embed.proj.0.weight' in err
    assert not osp.exists(tmp_path / 'out.pth')


def test_converter_lists_missing_and_unexpected_keys():
    state = _classifier_state(UFOViT(arch=dict(embed_dims=32, depth=4, num_heads=2),
                                     out_indices=(3, )))
    del state['backbone.blocks.2.mlp.fc2.bias']
    state['backbone.blocks.1.extra.weight'] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        converter_tool.ufo_vit_cls_to_backbone({'state_dict': state})
    message = str(info.value)
    assert 'missing keys: blocks.2.mlp.fc2.bias;' in message
    assert 'unexpected keys: blocks.1.extra.weight.' in message

    state = _classifier_state(UFOViT(arch=dict(embed_dims=32, depth=4, num_heads=2)))
    state['backbone.blocks.0.norm3.weight'] = torch.zeros(5)
    with pytest.raises(ValueError, match=r'blocks.0.norm3.weight: \(5,\) '
                       r'\(expected \(32,\)\)'):
        converter_tool.ufo_vit_cls_to_backbone({'state_dict': state})
    with pytest.raises(ValueError, match="no tensors under 'backbone.'"):
        converter_tool.ufo_vit_cls_to_backbone(
            {'state_dict': {'head.fc.weight': torch.zeros(2)}})


def test_converter_detects_custom_arch():
    arch = dict(embed_dims=48, depth=5, num_heads=3, mlp_ratio=2, local_kernel_size=5,
                pos_hidden_dims=8)
    state = _classifier_state(UFOViTStride16(arch=arch, in_channels=4, qkv_bias=False))
    wrapped = {'module.' + k: v for k, v in state.items()}  # DDP prefix
    backbone, info = converter_tool.ufo_vit_cls_to_backbone(wrapped)
    assert info['arch'] is None and info['arch_settings'] == arch
    assert info['in_channels'] == 4 and info['qkv_bias'] is False
    assert info['ema'] is False
    assert info['not_pretrained'] == PYRAMID_KEYS and info['dropped'] == [
        'module.head.fc.bias', 'module.head.fc.weight']
    model = UFOViT(arch=arch, in_channels=4, qkv_bias=False, out_indices=(3, ))
    model.load_state_dict(backbone, strict=True)


# ------------------------------------------------------------ mmsoft parts ---
def _renamed_block_state(block: ClassAttentionBlock, mmpretrain: bool = False) -> dict:
    """Our block's tensors under timm's XCiT names (``attn.q``, ``attn.k``,
    ``attn.v``, ``attn.proj``), or mmpretrain's (its FFN ``ffn.layers``)."""
    state = {}
    for key, value in block.state_dict().items():
        name, _, param = key.rpartition('.')  # name '' for gamma1, gamma2
        if name == 'kv':
            keys, values = value.chunk(2)
            state.update({f'attn.k.{param}': keys, f'attn.v.{param}': values})
        elif name in ('q', 'proj'):
            state[f'attn.{key}'] = value
        elif mmpretrain and name.startswith('mlp.'):
            fc = {'mlp.fc1': 'ffn.layers.0.0', 'mlp.fc2': 'ffn.layers.1'}[name]
            state[f'{fc}.{param}'] = value
        else:
            state[key] = value
    return state


def test_head_is_xcit_class_attention_stage():
    torch.manual_seed(0)
    head = class_attention_head(num_classes=5, in_channels=32, num_layers=2,
                                num_heads=4, layer_scale_init_value=0.5)
    head.init_weights()
    with torch.no_grad():  # move every tensor off its initial value
        for param in head.parameters():
            param.add_(0.1 * torch.randn_like(param))
    head.eval()
    reference = nn.ModuleList(
        TimmClassAttentionBlock(32, 4, qkv_bias=True, eta=0.5,
                                norm_layer=partial(nn.LayerNorm, eps=1e-6))
        for _ in range(2)).eval()
    for ours, theirs in zip(head.layers, reference):
        theirs.load_state_dict(_renamed_block_state(ours), strict=True)

    feats = torch.randn(3, 32, 4, 5)
    tokens = feats.flatten(2).transpose(1, 2)  # (B, 20, C)
    x = torch.cat((head.cls_token.expand(3, -1, -1), tokens), dim=1)
    with torch.no_grad():
        for block in reference:
            x = block(x)
        expected = head.fc(F.layer_norm(x[:, 0], (32, ), head.norm.weight,
                                        head.norm.bias, eps=1e-6))
        logits = head((feats, ))
        assert logits.shape == (3, 5)
        assert torch.allclose(logits, expected, atol=1e-5)
        # Tokens (B, N, C) are read as they are; their order does not matter.
        assert torch.allclose(head(tokens[:, torch.randperm(20)]), logits, atol=1e-5)
        # One block: timm's block, class token and patch tokens.
        joint = torch.cat((torch.randn(3, 1, 32), tokens), dim=1)
        assert torch.allclose(head.layers[0](joint), reference[0](joint), atol=1e-5)

    # A head saved with mmpretrain's block layout loads, to the same logits.
    state = {key: value for key, value in head.state_dict().items()
             if not key.startswith('layers.')}
    for i, block in enumerate(head.layers):
        state.update({f'layers.{i}.{key}': value for key, value in
                      _renamed_block_state(block, mmpretrain=True).items()})
    assert 'layers.0.attn.k.weight' in state and 'layers.0.kv.weight' not in state
    reloaded = class_attention_head(num_classes=5, in_channels=32, num_layers=2,
                                    num_heads=4).eval()
    reloaded.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(reloaded((feats, )), logits)


def test_head_losses_and_predictions_are_mmpretrains():
    torch.manual_seed(0)
    head = build(MODELS, dict(
        type='UFOViTClassAttentionHead', num_classes=4, in_channels=16, num_layers=1,
        num_heads=2, loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                               mode='original')))
    head.init_weights()
    feats = (torch.randn(3, 16, 2, 2), )
    logits = head(feats)
    labels = torch.tensor([0, 3, 1])
    samples = [DataSample().set_gt_label(int(i)) for i in labels]
    losses = head.loss(feats, samples)
    assert torch.allclose(losses['loss'],
                          F.cross_entropy(logits, labels, label_smoothing=0.1))
    # Mixup/CutMix targets: cross-entropy with the smoothed soft scores.
    targets = torch.softmax(torch.randn(3, 4), dim=1)
    samples = [DataSample().set_gt_label(0).set_gt_score(t) for t in targets]
    smoothed = 0.9 * targets + 0.1 / 4
    expected = -(smoothed * logits.log_softmax(dim=1)).sum(dim=1).mean()
    assert torch.allclose(head.loss(feats, samples)['loss'], expected, atol=1e-6)

    predicted = head.predict(feats)
    assert all(isinstance(p, DataSample) for p in predicted)
    assert torch.allclose(torch.stack([p.pred_score for p in predicted]),
                          logits.softmax(dim=1))
    assert [int(p.pred_label) for p in predicted] == logits.argmax(1).tolist()


def test_head_average_pooling_and_arguments():
    torch.manual_seed(0)
    pooling = class_attention_head(num_classes=7, in_channels=32, num_layers=0)
    pooling.init_weights()
    feats = torch.randn(3, 32, 4, 5)
    expected = pooling.fc(pooling.norm(feats.mean(dim=(2, 3))))
    assert torch.allclose(pooling(feats), expected)
    assert not hasattr(pooling, 'cls_token')
    with pytest.raises(ValueError, match='in_channels'):
        class_attention_head(num_classes=7, in_channels=30, num_heads=4)
    with pytest.raises(ValueError, match='num_layers=-1'):
        class_attention_head(num_classes=7, in_channels=32, num_layers=-1)
    with pytest.raises(ValueError, match=r'expected a map \(B, 32, h, w\)'):
        pooling(torch.randn(3, 16, 4, 5))


def test_ufo_vit_stride16_is_ufo_vit_before_its_final_pool():
    torch.manual_seed(0)
    arch = dict(embed_dims=32, depth=4, num_heads=2)
    ours = UFOViTStride16(arch=arch).eval()
    pooled = UFOViT(arch=arch, out_indices=(3, )).eval()
    pooled.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(pooled.state_dict())
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        (tokens, ), (expected, ) = ours(x), pooled(x)
        assert tokens.shape == (2, 32, 4, 5) and expected.shape == (2, 32, 2, 3)
        assert torch.allclose(F.max_pool2d(tokens, 2, ceil_mode=True), expected)
        # A padded batch: the second image is 32x48 at the top left.
        (masked, ) = ours(x, valid_shapes=[(64, 80), (32, 48)])
        (alone, ) = ours(x[1:, :, :32, :48])
    assert torch.allclose(masked[0], tokens[0], atol=1e-5)
    assert torch.allclose(masked[1, :, :2, :3], alone[0], atol=1e-5)
    assert masked[1, :, 2:].abs().max() == 0 and masked[1, :, :, 3:].abs().max() == 0
    with pytest.raises(ValueError, match='out_indices'):
        UFOViTStride16(arch=arch, out_indices=(2, 3))


def test_registered_in_mmpretrain_only():
    from mmengine.registry import MODELS as ROOT_MODELS
    for name, cls in (('UFOViTClassAttentionHead', UFOViTClassAttentionHead),
                      ('UFOViTStride16', UFOViTStride16)):
        assert MODELS.get(name) is cls
        assert name not in ROOT_MODELS.module_dict


# --------------------------------------------------------------- configs ---
@pytest.mark.parametrize('size', SIZES)
def test_imagenet_configs(size):
    cfg = Config.fromfile(osp.join(PRETRAIN_DIR, f'ufo-vit-{size}_8xb128-300e_in1k.py'))
    arch = ARCH_SETTINGS[size]
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.custom_imports.imports == ['mmsoft', 'mmsoft.pretrain']
    model = cfg.model
    assert model.type == 'ImageClassifier' and model.neck is None
    assert model.backbone.type == 'UFOViTStride16' and model.backbone.arch == size
    assert model.head.type == 'UFOViTClassAttentionHead' and model.head.num_layers == 2
    assert model.head.in_channels == arch['embed_dims']
    assert arch['embed_dims'] % model.head.num_heads == 0
    assert model.head.num_classes == cfg.data_preprocessor.num_classes == 1000
    assert model.head.loss == dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                   mode='original')
    assert model.train_cfg.augments == [dict(type='Mixup', alpha=0.8),
                                        dict(type='CutMix', alpha=1.0)]
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(
        5e-4 * cfg.auto_scale_lr.base_batch_size / 512)
    assert cfg.auto_scale_lr.base_batch_size == 8 * cfg.train_dataloader.batch_size
    assert set(cfg.optim_wrapper.paramwise_cfg.custom_keys) == {
        'pos_embed', 'gamma', 'cls_token'}
    assert cfg.train_cfg.max_epochs == 300
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.begin, cosine.end) == (
        'LinearLR', 5, 'CosineAnnealingLR', 5, 300)
    assert cfg.custom_hooks == [dict(type='EMAHook', momentum=4e-5,
                                     priority='ABOVE_NORMAL')]
    assert cfg.train_dataloader.dataset.type == 'ImageNet'
    augment, = [t for t in cfg.train_pipeline if t.type == 'RandAugment']
    assert augment.magnitude_level == 9 and augment.policies == 'timm_increasing'
    assert (cfg.val_evaluator.type, cfg.val_evaluator.topk) == ('Accuracy', (1, 5))


def test_imagenet_pipeline_and_model_on_demo_data(cls_data):
    cfg = Config.fromfile(osp.join(PRETRAIN_DIR, 'ufo-vit-tiny_8xb128-300e_in1k.py'))
    for split in ('train', 'val'):
        dataset = build(DATASETS, dict(cfg[f'{split}_dataloader'].dataset,
                                       data_root=cls_data))
        item = dataset[1]
        assert item['inputs'].shape == (3, 224, 224)
        assert item['inputs'].dtype == torch.uint8
        assert int(item['data_samples'].gt_label) == 1
    model = build(MODELS, dict(cfg.model, data_preprocessor=dict(
        cfg.data_preprocessor, type='ClsDataPreprocessor'))).eval()
    batch = model.data_preprocessor(dict(inputs=[item['inputs']],
                                         data_samples=[item['data_samples']]))
    with torch.no_grad():
        predicted = model(**batch, mode='predict')
    assert predicted[0].pred_score.shape == (1000, )
    assert float(predicted[0].pred_score.sum()) == pytest.approx(1, abs=1e-5)
