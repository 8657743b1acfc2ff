"""The chunked kernel product equals the plain one, values and gradients."""
import importlib

import pytest
import torch

from mmsoft.models.memory_efficient import chunked_kernel_product
from mmsoft.models.soft import gaussian_kernel, kernel_of_operands

kernel_attention_module = importlib.import_module('mmsoft.models.soft')


def plain_product(queries, bottleneck, middle, values):
    kernel = gaussian_kernel(queries, bottleneck)
    return kernel @ (middle @ (kernel.transpose(-1, -2) @ values))


def random_inputs(tokens=37, marks=5, dims=4, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return (0.5 * rand(2, 3, tokens, dims), 0.5 * rand(2, 3, marks, dims),
            rand(2, 3, marks, marks), rand(2, 3, tokens, dims))


@pytest.mark.parametrize('chunk', [1, 8, 37, 100])
def test_forward_equals_plain_product(chunk):
    inputs = random_inputs()
    torch.testing.assert_close(chunked_kernel_product(*inputs, chunk),
                               plain_product(*inputs))


@pytest.mark.parametrize('chunk', [1, 8, 37, 100])
def test_inference_equals_plain_product_and_holds_one_chunk(chunk, monkeypatch):
    kernel_rows = []

    def recorded_kernel(left, right, *args, **kwargs):
        kernel_rows.append(left.shape[-2])
        return kernel_of_operands(left, right, *args, **kwargs)

    inputs = random_inputs()
    expected = plain_product(*inputs)
    monkeypatch.setattr(kernel_attention_module, 'kernel_of_operands', recorded_kernel)
    with torch.no_grad():
        out = chunked_kernel_product(*inputs, chunk)
    torch.testing.assert_close(out, expected)
    assert kernel_rows and max(kernel_rows) == min(chunk, 37)


def test_gradients_equal_autograd_of_plain_product():
    inputs = [t.requires_grad_() for t in random_inputs()]
    weights = torch.randn(2, 3, 37, 4, dtype=torch.float64)
    (chunked_kernel_product(*inputs, 8) * weights).sum().backward()
    chunked = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    (plain_product(*inputs) * weights).sum().backward()
    for got, expected in zip(chunked, (t.grad for t in inputs)):
        torch.testing.assert_close(got, expected)


def test_gradcheck():
    inputs = [t.requires_grad_() for t in random_inputs(tokens=9, marks=3, dims=2)]
    assert torch.autograd.gradcheck(
        lambda q, l, m, v: chunked_kernel_product(q, l, m, v, 4), inputs)
