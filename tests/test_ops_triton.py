"""The ops' CUDA path on the CPU, under Triton's interpreter: each registered
operation launches the kernels :data:`mmsoft.ops.LAUNCHES` counts for it, and
SOFT's and UFO-ViT's blocks train through Triton's kernels as through
PyTorch, in float64 and float32 (``mmsoft.ops.triton_on_cpu``). Each kernel
against its op's reference, and compiled for sm_80 and sm_90:
``tests/test_triton_*.py``.
"""
# First: turns Triton's interpreter on before the kernels are defined.
from tests.helpers.triton_kernels import count_launches  # isort: skip

import copy

import pytest
import torch

from mmsoft.models.common import regions_on_grid
from mmsoft.models.soft import SoftBlock
from mmsoft.models.ufo_vit import UFOBlock
from mmsoft.ops import LAUNCHES, triton_on_cpu
from mmsoft.ops.triton import soft_inverse, soft_products, xnorm


def generated(*shapes, dtype=torch.float64, seed=0, scale=0.5):
    generator = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(*shape, generator=generator, dtype=dtype)
            for shape in shapes]


def launches_of(function, *args) -> int:
    with count_launches() as count:
        function(*args)
    return count.total


def test_each_operation_launches_what_the_kernel_count_counts():
    """The kernel count of a training step counts each ``mmsoft::`` operation
    as its CUDA implementation's launches: Triton's and torch's."""
    queries, bottleneck, middle, values = generated(
        (2, 2, 40, 8), (2, 2, 6, 8), (2, 2, 6, 6), (2, 2, 40, 8))
    out, summary, factor = soft_products.products_forward(queries, bottleneck, middle,
                                                          values, 0.7)
    inside = torch.tensor([[1.] * 6, [1.] * 4 + [0.] * 2], dtype=torch.float64)
    middle_out, alpha = soft_inverse.inverse_forward(bottleneck, inside, 'soft++', 3)
    qkv, = generated((2, 40, 24))
    gammas = torch.ones(2, dtype=torch.float64)
    attended, context = xnorm.xnorm_forward(qkv, 2, gammas, gammas, None, 1e-6)
    measured = {
        'kernel_products_forward': launches_of(
            soft_products.products_forward, queries, bottleneck, middle, values, 0.7),
        'kernel_products_backward': launches_of(
            soft_products.products_backward, out, queries, bottleneck, middle, values,
            summary, factor, 0.7),
        'newton_middle_forward': launches_of(
            soft_inverse.inverse_forward, bottleneck, inside, 'soft++', 3),
        'newton_middle_backward': launches_of(
            soft_inverse.inverse_backward, middle_out, bottleneck, inside, alpha,
            'soft++', 3),
        'xnorm_attention_forward': launches_of(
            xnorm.xnorm_forward, qkv, 2, gammas, gammas, None, 1e-6),
        'xnorm_attention_backward': launches_of(
            xnorm.xnorm_backward, attended, qkv, context, 2, gammas, gammas, None,
            1e-6),
    }
    assert measured == LAUNCHES


def soft_block(**kwargs):
    return SoftBlock(16, 2, sr_ratio=2, local_kernel_size=3, variant='soft++',
                     solver='newton', newton_iters=4, max_bottleneck_tokens=16,
                     **kwargs)


BLOCKS = {
    'soft++': (soft_block, (2, 48, 16), (6, 8), [(6, 8), (4, 6)]),
    'soft++-chunked': (lambda: soft_block(kernel_chunk_tokens=20), (2, 48, 16), (6, 8),
                       None),
    'ufo-vit': (lambda: UFOBlock(24, num_heads=2, layer_scale_init_value=0.5),
                (2, 30, 24), (5, 6), [(5, 6), (3, 4)]),
}


def trained(block, tokens, hw_shape, regions):
    """The output and the gradients of the tokens and every parameter."""
    tokens = tokens.clone().requires_grad_()
    out = block(tokens, hw_shape, regions)
    weights, = generated(out.shape, dtype=out.dtype, seed=9, scale=1.)
    (out * weights).sum().backward()
    return [out.detach(), tokens.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize('dtype, tolerance', [(torch.float64, 1e-10),
                                              (torch.float32, 2e-4)])
@pytest.mark.parametrize('name', list(BLOCKS))
def test_blocks_train_through_triton_as_through_pytorch(name, dtype, tolerance):
    build, shape, hw_shape, valid_shapes = BLOCKS[name]
    torch.manual_seed(0)
    block = build().to(dtype).train()
    twin = copy.deepcopy(block)
    tokens, = generated(shape, dtype=dtype, seed=1, scale=1.)
    regions = regions_on_grid(valid_shapes, hw_shape)
    expected = trained(block, tokens, hw_shape, regions)
    with triton_on_cpu():
        got = trained(twin, tokens, hw_shape, regions)
    for value, reference in zip(got, expected):
        scale = reference.abs().max()
        torch.testing.assert_close(value, reference, rtol=tolerance,
                                   atol=tolerance * scale)
