"""The backbones on a CUDA device: the ops' Triton kernels against their
references (float64 and float32), float16 and bfloat16 autocast
(``tools/train.py --amp``), batch independence, the solver the closed form
runs there, no host sync under CUDA's sync debug mode, TF32, and (where
mmdet and mmseg are installed) training steps of a Mask R-CNN and an UperNet
in float32 and under float16 autocast.

Imports torch and mmsoft's plain models only, so that it runs on a GPU node
that has torch (and pytest) and nothing of OpenMMLab; the detector and
segmentor tests skip themselves where mmdet or mmseg is missing. Every test
is skipped without a GPU (``make gpu-check`` runs them with a short
benchmark).
"""
import pytest
import torch

from mmsoft.models import SOFT, UFOViT
from mmsoft.ops.kernel_inverse import (SOLVERS, NewtonMiddle, gaussian_kernel,
                                       kernel_inverse, middle_matrix, solver_that_runs,
                                       token_mask)
from mmsoft.ops.soft import KernelProducts, kernel_products_reference
from mmsoft.ops.xnorm import XNormAttention, xnorm_attention_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')
DEVICE = 'cuda'
SOFT_TINY_CHANNELS = (64, 128, 320, 512)
STRIDES = (4, 8, 16, 32)


def soft_tiny(solver='newton_closed_form', **kwargs):
    """SOFT++-tiny as the configs set it up, with the given solver."""
    return SOFT(arch='tiny', variant='soft++', solver=solver,
                max_bottleneck_tokens=256, drop_path_rate=0., **kwargs)


def ufo_vit_tiny(**kwargs):
    return UFOViT(arch='tiny', drop_path_rate=0., **kwargs)


def feature_maps(model, images, valid_shapes=None):
    """The four maps (strides 4-32) of ``model`` on ``images`` (B, 3, H, W)."""
    return model.forward_intermediates(images, intermediates_only=True,
                                       valid_shapes=valid_shapes)


BACKBONES = [pytest.param(lambda s=s: soft_tiny(s), id=f'soft++-{s}')
             for s in SOLVERS] + [pytest.param(ufo_vit_tiny, id='ufo-vit')]


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('make_backbone', BACKBONES)
def test_autocast_forward_and_backward(make_backbone, dtype):
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip('this GPU has no bfloat16')
    torch.manual_seed(0)
    model = make_backbone().to(DEVICE).train()
    images = torch.randn(2, 3, 256, 320, device=DEVICE)  # (B, 3, H, W)
    with torch.autocast(DEVICE, dtype=dtype):
        outs = feature_maps(model, images)
    assert [o.shape[-2:] for o in outs] == [(256 // s, 320 // s) for s in STRIDES]
    loss = sum(o.float().square().mean() for o in outs)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize('make_backbone', BACKBONES)
def test_image_alone_equals_image_in_batch(make_backbone):
    """In full float32: cuDNN's TF32 convolutions (on by default) round
    differently for other batch sizes, and SOFT's kernel inverse magnifies
    rounding at random initialisation."""
    torch.manual_seed(0)
    model = make_backbone().to(DEVICE).eval()
    images = torch.randn(3, 3, 224, 288, device=DEVICE)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        batched = feature_maps(model, images)
        alone = feature_maps(model, images[1:2])
    for got, expected in zip(alone, batched):
        torch.testing.assert_close(got, expected[1:2], rtol=1e-4, atol=1e-4)


TOLERANCES = [(torch.float64, 1e-10), (torch.float32, 1e-4)]


def random(*shape, dtype, seed=0, scale=0.5):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return scale * torch.randn(*shape, generator=generator, device=DEVICE, dtype=dtype)


def assert_fused_equals_reference(fused, reference, inputs, tolerance):
    """Outputs and input gradients of the ops' CUDA implementations (Triton's
    kernels) against their references, relative to each tensor's largest."""
    results = []
    for function in (fused, reference):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = function(*leaves)
        (out * random(*out.shape, dtype=out.dtype, seed=9, scale=1.)).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for got, expected in zip(*results):
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=tolerance,
                                   atol=tolerance * scale)


@pytest.mark.parametrize('dtype, tolerance', TOLERANCES)
@pytest.mark.parametrize('tokens, marks', [(1000, 64), (6000, 256)])
def test_kernel_products_equal_the_reference(dtype, tolerance, tokens, marks):
    """Queries and values (2, 3, N, 32) as views of NCHW maps."""
    queries, values = (random(2, 3 * 32, tokens, dtype=dtype, seed=seed).view(
        2, 3, 32, tokens).transpose(-1, -2) for seed in (1, 2))
    bottleneck = random(2, 3, marks, 32, dtype=dtype, seed=3)
    middle = random(2, 3, marks, marks, dtype=dtype, seed=4, scale=0.1)
    assert_fused_equals_reference(
        lambda *t: KernelProducts.apply(*t, 0.42, tokens),
        lambda *t: kernel_products_reference(*t, 0.42),
        [queries, bottleneck, middle, values], tolerance)


@pytest.mark.parametrize('dtype, tolerance', TOLERANCES)
@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('marks, counts', [(256, None), (256, [256, 180]),
                                           (49, None), (7, [7, 5])])
def test_newton_middle_equals_the_reference(dtype, tolerance, variant, marks, counts):
    """The configs' 256 bottleneck tokens, a small bottleneck, and images with
    fewer tokens than the batch's; 20 Newton steps."""
    bottleneck = random(2, 4, marks, 32, dtype=dtype, seed=5, scale=0.3)
    inside = None if counts is None else token_mask(counts, marks, DEVICE, dtype)

    def reference(tokens):
        kernel = gaussian_kernel(tokens, tokens, float32_products=True)
        return middle_matrix(kernel, variant, 'newton', 20, counts)

    assert_fused_equals_reference(lambda tokens: NewtonMiddle.apply(tokens, inside,
                                                                    variant, 20),
                                  reference, [bottleneck],
                                  tolerance if dtype == torch.float64 else 1e-3)


@pytest.mark.parametrize('dtype, tolerance', TOLERANCES)
@pytest.mark.parametrize('masked', [False, True])
def test_xnorm_attention_equals_the_reference(dtype, tolerance, masked):
    """UFO-ViT-small's heads (8 of 38 channels) on 2 x 3000 tokens."""
    qkv = random(2, 3000, 3 * 304, dtype=dtype, seed=6, scale=1.)
    key_mask = None
    if masked:
        key_mask = torch.ones(2, 3000, dtype=torch.bool, device=DEVICE)
        key_mask[1, 2000:] = False
    gammas = [1 + random(8, dtype=dtype, seed=seed) for seed in (7, 8)]
    assert_fused_equals_reference(
        lambda *t: XNormAttention.apply(t[0], 8, t[1], t[2], key_mask, 1e-6),
        lambda *t: xnorm_attention_reference(t[0], 8, t[1], t[2], key_mask, 1e-6),
        [qkv, *gammas], tolerance)


def test_closed_form_runs_the_iteration_on_the_gpu():
    """On a GPU, SOFT++ with the configs' ``'newton_closed_form'`` computes
    what ``'newton'`` computes (the iteration), which is the CPU's closed
    form within float32 rounding."""
    assert solver_that_runs('newton_closed_form', DEVICE) == 'newton'
    torch.manual_seed(0)
    closed_form = soft_tiny('newton_closed_form').to(DEVICE).eval()
    iteration = soft_tiny('newton').to(DEVICE).eval()
    iteration.load_state_dict(closed_form.state_dict())
    images = torch.randn(2, 3, 128, 160, device=DEVICE)
    with torch.no_grad():
        got = feature_maps(closed_form, images)
        expected = feature_maps(iteration, images)
    for got_map, expected_map in zip(got, expected):
        torch.testing.assert_close(got_map, expected_map, rtol=1e-6, atol=1e-6)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    points = 0.5 * torch.randn(1, 2, 20, 8, generator=generator, device=DEVICE)
    mats = gaussian_kernel(points, points)
    on_gpu = kernel_inverse(mats, 'soft++', 'newton')
    on_cpu = kernel_inverse(mats.cpu(), 'soft++', 'newton_closed_form')
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.mmcv_ops  # trains Mask R-CNN
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'fp16-autocast'])
def test_mask_rcnn_training_step(amp):
    pytest.importorskip('mmdet', reason='the Mask R-CNN step needs mmdet')
    from tests.helpers.dense_models import (backbone_grad_norm, build_mask_rcnn,
                                            detector_train_step)
    model = build_mask_rcnn(dict(type='SOFT', arch='tiny', variant='soft++',
                                 solver='newton_closed_form',
                                 max_bottleneck_tokens=256),
                            SOFT_TINY_CHANNELS).to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.float16, enabled=amp):
        losses = detector_train_step(model, size=(128, 160), batch_size=2)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0


@pytest.mark.mmcv_ops  # trains UperNet
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'fp16-autocast'])
def test_upernet_training_step(amp):
    pytest.importorskip('mmseg', reason='the UperNet step needs mmsegmentation')
    from tests.helpers.dense_models import (backbone_grad_norm, build_upernet,
                                            segmentor_train_step)
    model = build_upernet(dict(type='UFOViT', arch='tiny'), [192] * 4).to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.float16, enabled=amp):
        losses = segmentor_train_step(model, size=(128, 128), batch_size=2)
    assert 'decode.loss_ce' in losses
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0


@pytest.mark.parametrize('make_backbone', [
    pytest.param(lambda: soft_tiny('newton_closed_form'), id='soft++-closed-form'),
    pytest.param(lambda: soft_tiny('newton'), id='soft++-newton'),
    pytest.param(ufo_vit_tiny, id='ufo-vit')])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'inference'])
def test_no_host_sync_under_sync_debug_mode(make_backbone, training):
    """Batch 2 with valid regions; CUDA raises on any synchronisation."""
    torch.manual_seed(0)
    model = make_backbone().to(DEVICE).train(training)
    images = torch.randn(2, 3, 256, 320, device=DEVICE)
    valid_shapes = [(256, 320), (192, 224)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        with torch.set_grad_enabled(training):
            outs = feature_maps(model, images, valid_shapes)
            if training:
                sum(o.float().square().mean() for o in outs).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(outs) == 4


def test_tf32_kernel_and_inverse_stay_float32_accurate():
    """With TF32 matmuls on, the bottleneck kernel and its Newton inverse
    against float64."""
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    points = 0.3 * torch.randn(2, 10, 240, 32, device=DEVICE, generator=generator)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        kernel = gaussian_kernel(points, points, float32_products=True)
        inverse = kernel_inverse(kernel, 'soft++', 'newton')
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    reference = gaussian_kernel(points.double(), points.double())
    reference_inverse = kernel_inverse(reference, 'soft++', 'newton')
    kernel_error = ((kernel - reference).abs().max() / reference.abs().max()).item()
    inverse_error = ((inverse - reference_inverse).norm()
                     / reference_inverse.norm()).item()
    assert kernel_error < 1e-5
    assert inverse_error < 1e-3
