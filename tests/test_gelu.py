"""mmsoft's exact GELU: a correct backward for any gradient layout.

torch 2.1's CPU kernel of GELU's backward reads a gradient laid out unlike
GELU's input with the input's strides: wrong float32 gradients and NaN in
bfloat16. SOFT attention's kernels return such (transposed) gradients to
the GELU of the bottleneck tokens, so on that torch the plain-autograd
path's gradients were wrong. These tests hold on every torch; on the
affected ones they fail without :func:`mmsoft.models.common.gelu`.
"""
import pytest
import torch
import torch.nn.functional as F

from mmsoft.openmmlab import SOFT
from mmsoft.models.common import GELU
from mmsoft.models.common import gelu
from mmsoft.models.common import set_memory_efficient
from mmsoft.models.common import GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT


def _transposed_gradient(shape, dtype):
    """A gradient of ``shape`` laid out as the transpose of its last two
    dimensions."""
    *lead, rows, cols = shape
    return torch.randn(*lead, cols, rows, dtype=dtype).transpose(-1, -2)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('shape', [(2, 2, 6, 8), (1, 2, 6, 16), (2, 4, 12, 32)])
def test_gelu_gradient_does_not_depend_on_the_gradient_layout(shape, dtype):
    torch.manual_seed(0)
    inputs = torch.randn(*shape).to(dtype).requires_grad_()
    gradient = _transposed_gradient(shape, dtype)
    (strided,) = torch.autograd.grad(gelu(inputs), inputs, gradient)
    (contiguous,) = torch.autograd.grad(gelu(inputs), inputs, gradient.contiguous())
    # The reference: float64, whose kernel every torch gets right.
    inputs64 = inputs.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad(F.gelu(inputs64), inputs64, gradient.double())
    assert torch.isfinite(strided).all()
    torch.testing.assert_close(strided, contiguous)
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(strided, expected.to(dtype), **tolerance)


def test_gelu_module_is_exact_gelu():
    torch.manual_seed(0)
    inputs = torch.randn(3, 5)
    assert isinstance(GELU(), torch.nn.GELU)
    torch.testing.assert_close(GELU()(inputs), F.gelu(inputs))


def test_detection_matches_torch():
    """The flag says whether torch's own kernel gets a transposed gradient
    wrong, on this torch and CPU."""
    torch.manual_seed(0)
    inputs = torch.randn(2, 8, 16, requires_grad=True)
    gradient = _transposed_gradient((2, 8, 16), torch.float32)
    (strided,) = torch.autograd.grad(F.gelu(inputs), inputs, gradient)
    (contiguous,) = torch.autograd.grad(F.gelu(inputs), inputs, gradient.contiguous())
    assert GELU_BACKWARD_NEEDS_CONTIGUOUS_GRADIENT == (
        not torch.allclose(strided, contiguous))


@pytest.mark.parametrize('memory_efficient', [False, True])
def test_soft_float32_gradients_equal_float64_ones(memory_efficient):
    """SOFT++'s float32 gradients, plain autograd or memory-efficient, equal
    its float64 gradients (on torch 2.1 the plain path's bottleneck GELU made
    a parameter's gradient cosine to float64 as low as -0.8)."""
    arch = dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
                depths=[1, 1, 1, 1])
    torch.manual_seed(0)
    backbone = SOFT(arch, variant='soft++', solver='exact', drop_path_rate=0.)
    set_memory_efficient(backbone.train(), memory_efficient)
    images = torch.randn(2, 3, 64, 96)

    def gradients(model, inputs):
        model.zero_grad(set_to_none=True)
        outs = model(inputs, [(64, 96), (64, 64)])
        sum((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype)
             .view_as(out)).mean() for out in outs).backward()
        return {name: p.grad.double().clone() for name, p in model.named_parameters()
                if p.grad is not None}

    grads32 = gradients(backbone, images)
    grads64 = gradients(backbone.double(), images.double())
    assert grads32.keys() == grads64.keys() and grads64
    # Relative to each parameter's gradient, and to the largest one for
    # gradients that are zero in exact arithmetic (a bias before BatchNorm).
    largest = max(float(grad.norm()) for grad in grads64.values())
    for name, grad64 in grads64.items():
        error = float((grads32[name] - grad64).norm())
        assert error <= 1e-3 * float(grad64.norm()) + 1e-6 * largest, name
