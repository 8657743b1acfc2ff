"""The backbones on a CUDA device: float16 and bfloat16 autocast
(``tools/train.py --amp``), batch independence, the chunked kernel product,
the solver the closed form runs there, and training steps of a Mask R-CNN
and an UperNet in float32 and under float16 autocast. Every test is skipped
without a GPU (``make gpu-check`` runs them with a short benchmark).
"""
import pytest
import torch

from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.models.soft_kernels import gaussian_kernel, kernel_inverse
from mmsoft.models.soft_kernels import SOLVERS
from mmsoft.models.soft_kernels import chunked_kernel_product
from mmsoft.models.soft_kernels import kernel_inverse as memory_efficient_kernel_inverse
from mmsoft.testing.dense_models import (backbone_grad_norm, build_mask_rcnn,
                                         build_upernet, detector_train_step,
                                         segmentor_train_step)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')
DEVICE = 'cuda'
SOFT_TINY_CHANNELS = (64, 128, 320, 512)


def soft_tiny(solver='newton_closed_form', **kwargs):
    """SOFT++-tiny as the configs set it up, with the given solver."""
    return SOFT(arch='tiny', variant='soft++', solver=solver,
                max_bottleneck_tokens=256, drop_path_rate=0., **kwargs)


def ufo_vit_tiny(**kwargs):
    return UFOViT(arch='tiny', drop_path_rate=0., **kwargs)


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
    with torch.autocast('cuda', dtype=dtype):
        outs = model(images)
    assert [o.shape[-2:] for o in outs] == [(256 // s, 320 // s)
                                            for s in (4, 8, 16, 32)]
    loss = sum(o.float().square().mean() for o in outs)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize('make_backbone', BACKBONES)
def test_image_alone_equals_image_in_batch(make_backbone):
    torch.manual_seed(0)
    model = make_backbone().to(DEVICE).eval()
    images = torch.randn(3, 3, 224, 288, device=DEVICE)
    with torch.no_grad():
        batched = model(images)
        alone = model(images[1:2])
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
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    points = 0.5 * torch.randn(1, 2, 20, 8, generator=generator, device=DEVICE)
    mats = gaussian_kernel(points, points).requires_grad_()
    inverse = memory_efficient_kernel_inverse(mats, 'soft++', 'newton_closed_form')
    assert type(inverse.grad_fn).__name__ == '_NewtonIterationsBackward'
    on_cpu = kernel_inverse(mats.detach().cpu(), 'soft++', 'newton_closed_form')
    torch.testing.assert_close(inverse.detach().cpu(), on_cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.mmcv_ops  # trains Mask R-CNN
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'fp16-autocast'])
def test_mask_rcnn_training_step(amp):
    model = build_mask_rcnn(dict(type='SOFT', arch='tiny', variant='soft++',
                                 solver='newton_closed_form',
                                 max_bottleneck_tokens=256),
                            SOFT_TINY_CHANNELS).to(DEVICE)
    with torch.autocast('cuda', dtype=torch.float16, enabled=amp):
        losses = detector_train_step(model, size=(128, 160), batch_size=2)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0


@pytest.mark.mmcv_ops  # trains UperNet
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'fp16-autocast'])
def test_upernet_training_step(amp):
    model = build_upernet(dict(type='UFOViT', arch='tiny'), [192] * 4).to(DEVICE)
    with torch.autocast('cuda', dtype=torch.float16, enabled=amp):
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
            outs = model(images, valid_shapes)
            if training:
                sum(o.float().square().mean() for o in outs).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(outs) == 4


def test_tf32_kernel_and_inverse_stay_float32_accurate():
    """With TF32 matmuls on, the bottleneck kernel and its Newton inverse
    against float64."""
    from mmsoft.models.soft_kernels import bottleneck_kernel
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    points = 0.3 * torch.randn(2, 10, 240, 32, device=DEVICE, generator=generator)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        kernel = bottleneck_kernel(points)
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
