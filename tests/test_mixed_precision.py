"""Training under ``torch.autocast`` on the CPU, in bfloat16 and float16.

GPU users train with mixed precision (``tools/train.py --amp``: mmengine's
``AmpOptimWrapper``, float16 autocast); mmengine refuses it on CPU, so these
tests run the same autocast forward and backward directly:

* every memory-saving layer gives the plain-autograd result under autocast
  too, and does take its memory-saving path there;
* the parts documented as float32 (kernels, inverses, XNorm) stay float32;
* training steps of both backbones (every solver, valid regions,
  ``with_cp``, ``recompute_mlp``, the chunked kernel product) give
  gradients as close to float32 ones as mmdet's Swin-T and PVTv2 manage
  (cosine 0.948 in bfloat16 and 0.9993 in float16): at least 0.95 and
  0.999.

Float16 autocast on the CPU needs torch >= 2.2 (torch 2.1 turns it off with
a warning); those cases are skipped there.
"""
import contextlib
import math
import os.path as osp
import warnings

import pytest
import torch

from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.models.common import ConvPatchEmbed, autocast_dtype, set_memory_efficient
from mmsoft.models.soft import SOLVERS, SoftBlock, SoftmaxBlock, kernel_inverse
from mmsoft.ops import layer_norm_mlp, soft_attention, xnorm_attention
from mmsoft.models.ufo_vit import UFOBlock

from tests.helpers.plain_autograd import LayerNormThenMLP, assert_same_as_plain


def cpu_autocast_supports(dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast('cpu', dtype=dtype)`` is honoured here."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            with torch.autocast('cpu', dtype=dtype):
                return autocast_dtype('cpu') == dtype
        except RuntimeError:  # torch 2.1: "AutocastCPU only support Bfloat16"
            return False


DTYPES = [
    pytest.param(torch.bfloat16, id='bf16'),
    pytest.param(torch.float16, id='fp16', marks=pytest.mark.skipif(
        not cpu_autocast_supports(torch.float16),
        reason='float16 autocast on the CPU needs torch >= 2.2')),
]
# Same result as the plain path, at the precision of the low dtype.
LOW_PRECISION = {torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
                 torch.float16: dict(rtol=3e-3, atol=3e-3)}
# Gradient cosine to float32 of a whole backbone, and of the backbone in a
# detector or segmentor (whose sampled proposals and losses add their own
# low-precision noise: measured 0.996-0.997 in float16).
MIN_COSINE = {torch.bfloat16: 0.95, torch.float16: 0.999}
MIN_COSINE_DENSE = {torch.bfloat16: 0.95, torch.float16: 0.99}


# --------------------------------------------------------------------------
# Layers: memory-saving path == plain autograd, under autocast
# --------------------------------------------------------------------------
class _Tokens(torch.nn.Module):
    """``layer(x, *args)``'s first output as one tensor, in float32."""

    def __init__(self, layer, *args):
        super().__init__()
        self.layer = layer
        self.args = args

    def forward(self, x):
        out = self.layer(x, *self.args)
        return (out[0] if isinstance(out, tuple) else out).float()


LAYERS = {
    'layer-norm-mlp': (lambda: LayerNormThenMLP(16, 64), (2, 30, 16), ()),
    'conv-stem': (lambda: ConvPatchEmbed([3, 8, 8, 12], [2, 1, 2]),
                  (2, 3, 20, 24), ()),
    'ufo-block': (lambda: UFOBlock(16, 2, layer_scale_init_value=0.5), (2, 30, 16),
                  ((5, 6), )),
    'softmax-block': (lambda: SoftmaxBlock(16, 2), (2, 30, 16), ((5, 6), )),
}
LAYERS.update({
    f'soft-block-{attention}-{solver}-chunk{chunk}': (
        lambda attention=attention, solver=solver, chunk=chunk: SoftBlock(
            16, 2, sr_ratio=2, local_kernel_size=3, variant=attention,
            solver=solver, newton_iters=6, kernel_chunk_tokens=chunk),
        (2, 30, 16), ((5, 6), ))
    for attention, solver, chunk in [('soft++', s, None) for s in SOLVERS]
    + [('soft', 'newton', None), ('soft++', 'newton_closed_form', 7)]
})


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', list(LAYERS))
def test_memory_saving_layers_equal_plain_autograd_under_autocast(name, dtype):
    build, shape, args = LAYERS[name]
    torch.manual_seed(0)
    layer = _Tokens(build().train(), *args)
    tokens = torch.randn(*shape)
    assert_same_as_plain(layer, [tokens], autocast=dtype,
                         tolerance=LOW_PRECISION[dtype])


@pytest.mark.parametrize('dtype', DTYPES)
def test_memory_saving_functions_run_under_autocast(dtype):
    """Under autocast the memory-saving functions run (no silent fallback)
    and give the dtype autocast's own layers would."""
    stem = ConvPatchEmbed([3, 8, 12], [2, 2]).train()
    tokens = torch.randn(2, 30, 16, requires_grad=True)
    with torch.autocast('cpu', dtype=dtype):
        stem_out = stem(torch.randn(1, 3, 16, 16, requires_grad=True))[0]
    block = LayerNormThenMLP(16, 64)
    with torch.autocast('cpu', dtype=dtype):
        normalized, hidden = layer_norm_mlp(tokens, block.norm, block.mlp)
    assert type(hidden.grad_fn).__name__ == 'LayerNormMLPBackward'
    # As LayerNorm's and Linear's outputs:
    assert (normalized.dtype, hidden.dtype) == (torch.float32, dtype)
    assert stem_out.dtype == dtype


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('solver', SOLVERS)
def test_kernel_inverse_stays_float32_under_autocast(solver, dtype):
    generator = torch.Generator().manual_seed(0)
    points = 0.5 * torch.randn(2, 3, 12, 8, generator=generator)
    mats = torch.exp(-0.5 * torch.cdist(points, points).pow(2))  # (2, 3, 12, 12)
    expected = kernel_inverse(mats, 'soft++', solver)
    leaf = mats.to(dtype).requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        inverse = kernel_inverse(leaf, 'soft++', solver)
    assert inverse.dtype == torch.float32
    torch.testing.assert_close(inverse, kernel_inverse(leaf.detach().float(),
                                                       'soft++', solver))
    assert (inverse - expected).norm() / expected.norm() < 0.1  # the input's rounding
    inverse.sum().backward()
    assert leaf.grad.dtype == dtype and torch.isfinite(leaf.grad).all()


OPS = {
    'soft-attention': (
        lambda queries, bottleneck, values: soft_attention(
            queries, bottleneck, values, 0.7, 'soft++', 'newton', 6, [9, 6],
            chunk_tokens=16),
        [(2, 2, 40, 8), (2, 2, 9, 8), (2, 2, 40, 8)]),
    'xnorm-attention': (lambda qkv: xnorm_attention(qkv, 2, torch.ones(2),
                                                    torch.ones(2)), [(2, 40, 24)]),
}


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', list(OPS))
def test_attention_ops_under_autocast_equal_float32(name, dtype):
    """Documented as float32: autocast changes nothing inside."""
    op, shapes = OPS[name]
    generator = torch.Generator().manual_seed(0)
    inputs = [(0.5 * torch.randn(*shape, generator=generator)).requires_grad_()
              for shape in shapes]
    expected = op(*inputs)
    expected_grads = torch.autograd.grad(expected.sum(), inputs)
    with torch.autocast('cpu', dtype=dtype):
        out = op(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


# --------------------------------------------------------------------------
# Backbones: training steps against float32
# --------------------------------------------------------------------------
# SOFT-tiny's and UFO-ViT-tiny's layouts with one block per stage, so that a
# float16 step (slow on CPUs) takes a second. SOFT keeps the demo's head
# width (32 channels): at 16 channels a head's bottleneck kernel is so
# ill-conditioned that the Newton solvers' bfloat16 outputs moved 0.164 from
# float32 on an AMX CPU, where the configs' SOFT++-tiny moves 0.018.
SMALL_SOFT = dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
                  depths=[1, 1, 1, 1])
SMALL_UFO_VIT = dict(embed_dims=48, depth=4, num_heads=2)


def soft_pp(**kwargs):
    return SOFT(SMALL_SOFT, variant='soft++', drop_path_rate=0.,
                max_bottleneck_tokens=256, **kwargs)


def ufo_vit(**kwargs):
    return UFOViT(SMALL_UFO_VIT, drop_path_rate=0., **kwargs)


BACKBONES = {
    **{f'soft++-{solver}': (lambda solver=solver: soft_pp(solver=solver), None)
       for solver in SOLVERS},
    'soft-newton': (lambda: SOFT(SMALL_SOFT, variant='soft', solver='newton',
                                 drop_path_rate=0.), None),
    'soft++-valid-regions': (lambda: soft_pp(solver='newton_closed_form'),
                             [(64, 96), (64, 64)]),
    'soft++-with-cp-recompute-mlp-chunked': (
        lambda: soft_pp(solver='newton_closed_form', with_cp=True,
                        recompute_mlp=True, kernel_chunk_tokens=100), None),
    'ufo-vit': (ufo_vit, None),
    'ufo-vit-valid-regions': (ufo_vit, [(64, 96), (64, 64)]),
    'ufo-vit-with-cp-recompute-mlp': (
        lambda: ufo_vit(with_cp=True, recompute_mlp=True), None),
}


def training_gradients(backbone, images, valid_shapes, dtype=None):
    """Parameter gradients of a fixed weighting of the backbone's maps,
    the forward under autocast to ``dtype`` (None: float32)."""
    backbone.zero_grad(set_to_none=True)
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16,
                        enabled=dtype is not None):
        outs = backbone(images, valid_shapes)
    # Means, as the detectors' losses are: float16 gradients stay in range
    # without a loss scale.
    loss = sum((out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).mean()
               for out in outs)
    loss.backward()
    grads = {name: p.grad for name, p in backbone.named_parameters()
             if p.grad is not None}
    return outs, grads


def cosine(first: dict, second: dict) -> float:
    a = torch.cat([first[name].double().flatten() for name in sorted(second)])
    b = torch.cat([second[name].double().flatten() for name in sorted(second)])
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', ['soft++-newton', 'soft++-exact', 'soft-newton',
                                  'soft++-valid-regions', 'ufo-vit-valid-regions'])
def test_plain_autograd_gradients_are_finite_under_autocast(name, dtype):
    """With the memory-efficient path off, every gradient, the images' too,
    is finite (torch 2.1's bfloat16 GELU backward made NaN of SOFT's
    bottleneck gradients on AVX512-BF16 CPUs)."""
    build, valid_shapes = BACKBONES[name]
    torch.manual_seed(0)
    backbone = set_memory_efficient(build().train(), False)
    images = torch.randn(2, 3, 64, 96, requires_grad=True)
    _, grads = training_gradients(backbone, images, valid_shapes, dtype)
    assert len(grads) > 0
    assert all(torch.isfinite(grad).all() for grad in grads.values())
    assert images.grad.abs().sum() > 0 and torch.isfinite(images.grad).all()


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', list(BACKBONES))
def test_backbone_training_step_under_autocast(name, dtype):
    build, valid_shapes = BACKBONES[name]
    torch.manual_seed(0)
    backbone = build().train()
    images = torch.randn(2, 3, 64, 96)
    # BatchNorm statistics would move between the two passes: eval mode for
    # them, training mode (DropPath off) for everything else.
    for module in backbone.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    outs32, grads32 = training_gradients(backbone, images, valid_shapes)
    outs, grads = training_gradients(backbone, images, valid_shapes, dtype)
    assert [o.shape for o in outs] == [o.shape for o in outs32]
    assert grads.keys() == grads32.keys() and len(grads32) > 0
    assert all(torch.isfinite(grad).all() for grad in grads.values())
    assert all(grad.dtype == torch.float32 for grad in grads.values())
    assert cosine(grads, grads32) >= MIN_COSINE[dtype]
    for out, out32 in zip(outs, outs32):  # bfloat16 keeps 8 bits
        assert float((out.detach().float() - out32.detach()).norm()
                     / out32.detach().norm()) < 0.15


# --------------------------------------------------------------------------
# Mask R-CNN and UperNet from the demo configs
# --------------------------------------------------------------------------
def _config_model(path: str):
    from mmengine.config import Config

    from mmsoft.apis import build_model_from_config
    cfg = Config.fromfile(path)
    model = build_model_from_config(cfg)
    model.init_weights()
    return cfg, model


def _step_gradients(model, batch, autocast_parts, dtype):
    """One training step (data preprocessor, losses, backward) with
    ``autocast_parts(model, dtype)`` deciding where autocast is on; returns
    the losses and the backbone's gradients."""
    torch.manual_seed(0)  # the detectors' samplers
    model.train()
    model.zero_grad(set_to_none=True)
    with autocast_parts(model, dtype):
        data = model.data_preprocessor(batch, True)
        total, log_vars = model.parse_losses(model(**data, mode='loss'))
    total.backward()
    grads = {name: p.grad for name, p in model.backbone.named_parameters()
             if p.grad is not None}
    return {k: float(v) for k, v in log_vars.items()}, grads


@contextlib.contextmanager
def _whole_model(model, dtype):
    """Autocast around the whole step, as ``AmpOptimWrapper`` does."""
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16,
                        enabled=dtype is not None):
        yield


@contextlib.contextmanager
def _features_only(model, dtype):
    """Autocast around backbone and neck: mmcv's CPU kernels (NMS, RoIAlign)
    take float32 only, so on the CPU the heads run in float32 (on CUDA,
    ``tests/test_cuda.py`` runs the whole detector under autocast)."""
    extract_feat = model.extract_feat

    def features(images):
        with torch.autocast('cpu', dtype=dtype or torch.bfloat16,
                            enabled=dtype is not None):
            return tuple(feat.float() for feat in extract_feat(images))

    model.extract_feat = features
    try:
        yield
    finally:
        del model.extract_feat


DENSE_MODELS = {
    'mask-rcnn': ('configs/demo/mask-rcnn_soft-tiny_fpn_demo.py', _features_only),
    'upernet': ('configs/demo/upernet_soft-tiny_demo.py', _whole_model),
}


@pytest.mark.mmcv_ops
@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', list(DENSE_MODELS))
def test_dense_model_training_step_under_autocast(name, dtype, repo_root):
    path, autocast_parts = DENSE_MODELS[name]
    cfg, model = _config_model(osp.join(repo_root, path))
    if name == 'mask-rcnn':
        from mmdet.testing import demo_mm_inputs
        torch.manual_seed(0)
        batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 96, 128)] * 2,
                               num_items=[3, 3], with_mask=True,
                               num_classes=cfg.model.roi_head.bbox_head.num_classes)
    else:
        from tests.helpers.dense_models import demo_seg_inputs

        # The demo's crop size: no padding, whose label 255 mmseg's
        # class-weighted loss cannot index.
        batch = demo_seg_inputs(2, cfg.crop_size, cfg.model.decode_head.num_classes)
    losses32, grads32 = _step_gradients(model, batch, autocast_parts, None)
    losses, grads = _step_gradients(model, batch, autocast_parts, dtype)
    assert losses.keys() == losses32.keys()
    assert all(math.isfinite(value) for value in losses.values())
    assert losses['loss'] == pytest.approx(losses32['loss'], rel=0.02)
    assert grads.keys() == grads32.keys() and len(grads32) > 0
    assert all(torch.isfinite(grad).all() for grad in grads.values())
    assert cosine(grads, grads32) >= MIN_COSINE_DENSE[dtype]
