"""Float32 accuracy of SOFT's kernel and inverse when matmuls run in TF32.

A CPU has no TF32 units, so :func:`tf32_matmul` emulates one: operands
rounded to TF32's 10 mantissa bits, products accumulated in float64.
"""
import pytest
import torch

import mmsoft.ops.kernel_inverse as float32_matmul_module
from mmsoft.ops.kernel_inverse import (float32_matmul, gaussian_kernel, split_tf32,
                                       three_pass_matmul)


def round_to_tf32(tensor: torch.Tensor) -> torch.Tensor:
    """Round to nearest of TF32's 10 mantissa bits (as tensor cores do)."""
    bits = tensor.view(torch.int32)
    rounded = (bits + 0x1000) & -(1 << 13)
    return rounded.view(torch.float32)


def tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (round_to_tf32(a).double() @ round_to_tf32(b).double()).float()


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).abs().max() / expected.abs().max()).item()


def test_split_is_exact_and_tf32_representable():
    x = torch.randn(1000) * torch.logspace(-6, 6, 1000)
    high, low = split_tf32(x)
    assert torch.equal(high + low, x)
    assert torch.equal(round_to_tf32(high), high)
    assert (low.abs() <= 2**-10 * x.abs()).all()


def test_three_passes_recover_float32_accuracy_under_tf32():
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(4, 64, 32, generator=generator)
    b = torch.randn(4, 32, 48, generator=generator)
    reference = a.double() @ b.double()
    one_pass = relative_error(tf32_matmul(a, b), reference)
    three_passes = relative_error(three_pass_matmul(a, b, matmul=tf32_matmul),
                                  reference)
    assert one_pass > 1e-4  # what TF32 alone gives
    assert three_passes < 2e-6  # a few units in float32's last place


def bottleneck_points(generator) -> torch.Tensor:
    # Bottleneck tokens after LayerNorm and GELU, scaled by d^-1/4: (2, 5, 40, 16)
    tokens = torch.randn(2, 5, 40, 16, generator=generator)
    return 0.5 * torch.nn.functional.gelu(tokens)


@pytest.mark.parametrize('precision, three_passes', [('highest', False),
                                                     ('high', True),
                                                     ('medium', True)])
def test_float32_matmul_follows_the_precision_setting(monkeypatch, precision,
                                                      three_passes):
    calls = []
    monkeypatch.setattr(float32_matmul_module, 'three_pass_matmul',
                        lambda a, b: calls.append(1) or a @ b)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        float32_matmul(torch.randn(3, 4), torch.randn(4, 5))
        float32_matmul(torch.randn(3, 4).double(), torch.randn(4, 5).double())
    finally:
        torch.set_float32_matmul_precision(previous)
    assert len(calls) == int(three_passes)  # never for float64


def test_bottleneck_kernel_is_float32_accurate_under_tf32(monkeypatch):
    """The kernel matrix A with TF32 matmuls: its norm terms never go
    through a matmul, and ``x.y`` is computed in three passes."""
    points = bottleneck_points(torch.Generator().manual_seed(0))
    reference = gaussian_kernel(points.double(), points.double())
    float32_error = relative_error(gaussian_kernel(points, points), reference)
    monkeypatch.setattr(torch, 'matmul', tf32_matmul)
    monkeypatch.setattr(float32_matmul_module, 'reduced_precision_matmuls',
                        lambda device: True)
    kernel = gaussian_kernel(points, points, float32_products=True)
    one_pass = gaussian_kernel(points, points)  # x.y in TF32, norms exact
    # float32's error within a few units in the last place; TF32's 100x more.
    assert relative_error(kernel, reference) < 8 * float32_error
    assert relative_error(one_pass, reference) > 100 * float32_error


def test_gradients_are_those_of_the_product(monkeypatch):
    """Through the three passes, autograd gives ``grad @ b^T`` and
    ``a^T @ grad`` (each in three passes), broadcasting included."""
    monkeypatch.setattr(float32_matmul_module, 'reduced_precision_matmuls',
                        lambda device: True)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(3, 20, 16, generator=generator, requires_grad=True)
    b = torch.randn(16, 24, generator=generator, requires_grad=True)  # broadcast
    weights = torch.randn(3, 20, 24, generator=generator)
    (float32_matmul(a, b) * weights).sum().backward()
    a64, b64 = a.detach().double(), b.detach().double()
    expected_a = weights.double() @ b64.T
    expected_b = (a64.transpose(-1, -2) @ weights.double()).sum(0)
    assert relative_error(a.grad, expected_a) < 1e-6
    assert relative_error(b.grad, expected_b) < 1e-6
