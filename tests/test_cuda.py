"""The backbones on a CUDA device: float16 and bfloat16 autocast
(``tools/train.py --amp``), batch independence, the chunked kernel product,
the solver the closed form runs there, no host sync under CUDA's sync debug
mode, TF32, and (where mmdet and mmseg are installed) training steps of a
Mask R-CNN and an UperNet in float32 and under float16 autocast.

Imports torch and mmsoft's plain models only, so that it runs on a GPU node
that has torch (and pytest) and nothing of OpenMMLab; the detector and
segmentor tests skip themselves where mmdet or mmseg is missing. Every test
is skipped without a GPU (``make gpu-check`` runs them with a short
benchmark).
"""
import pytest
import torch

from mmsoft.models import SOFT, UFOViT
from mmsoft.models.soft import SOLVERS, gaussian_kernel, kernel_inverse, solver_that_runs
from mmsoft.models.memory_efficient import chunked_kernel_product

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


@pytest.mark.parametrize('dtype, tolerance', [(torch.float64, 1e-10),
                                              (torch.float32, 1e-4)])
def test_chunked_kernel_product_equals_plain_product(dtype, tolerance):
    generator = torch.Generator(device=DEVICE).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, device=DEVICE, dtype=dtype)

    # (B, heads, N, d) queries and values, (B, heads, m, d) bottleneck
    # tokens, (B, heads, m, m) middle matrix.
    queries, bottleneck = 0.5 * rand(2, 3, 1000, 16), 0.5 * rand(2, 3, 64, 16)
    middle, values = rand(2, 3, 64, 64), rand(2, 3, 1000, 16)
    kernel = gaussian_kernel(queries, bottleneck)  # (B, heads, N, m)
    plain = kernel @ (middle @ (kernel.transpose(-1, -2) @ values))
    for chunk in (1, 128, 1000, 4096):
        chunked = chunked_kernel_product(queries, bottleneck, middle, values, chunk)
        torch.testing.assert_close(chunked, plain, rtol=tolerance, atol=tolerance)
        with torch.no_grad():
            inferred = chunked_kernel_product(queries, bottleneck, middle, values,
                                              chunk)
        torch.testing.assert_close(inferred, plain, rtol=tolerance, atol=tolerance)


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
