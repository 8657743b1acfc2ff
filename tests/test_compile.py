"""torch.compile of both backbones: whole graphs, equal to eager execution.

The backend is ``'aot_eager'``: dynamo captures the graph (``fullgraph=True``
fails on any break) and AOT autograd traces forward and backward together,
as inductor does, but runs torch's own kernels (inductor's C++ code
generation takes minutes per model on two cores; ``tools/analysis/benchmark.py
--compile`` measures it). While compiling, the layers take their plain path
(:func:`~mmsoft.models.common.is_tracing`): the compiler plans the memory.
"""
import copy

import pytest
import torch

from mmsoft.utils.torch_compat import TORCH_VERSION

from tests.helpers.small_backbones import BACKBONES, IMAGE_SIZE, VALID_SHAPES

pytestmark = pytest.mark.skipif(
    TORCH_VERSION < (2, 2),
    reason="torch 2.1's dynamo fails inside SOFT's training step "
    '(InternalTorchDynamoError in the Newton iteration\'s autograd function)')

TOLERANCE = 1e-5


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, backend='aot_eager', fullgraph=True)


def training_step(model, images, forward=None):
    """Outputs, parameter gradients and buffers of ``model`` after one
    forward (through ``forward``, default ``model``) and backward."""
    outs = (model if forward is None else forward)(images, VALID_SHAPES)
    sum((out * out).mean() for out in outs).backward()
    grads = {name: param.grad for name, param in model.named_parameters()
             if param.grad is not None}
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    return [out.detach() for out in outs], grads, buffers


def assert_close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize('name', list(BACKBONES))
def test_compiled_training_step_equals_eager(name):
    torch.manual_seed(0)
    eager = BACKBONES[name]().train()
    model = copy.deepcopy(eager)
    images = torch.randn(2, 3, *IMAGE_SIZE)
    outs, grads, buffers = training_step(eager, images)
    compiled_outs, compiled_grads, compiled_buffers = training_step(
        model, images, forward=compiled(model))
    for out, expected in zip(compiled_outs, outs):
        assert_close(out, expected)
    assert compiled_grads.keys() == grads.keys() and len(grads) > 0
    for key, grad in grads.items():
        assert_close(compiled_grads[key], grad)
    # BatchNorm running statistics (UFO-ViT's local patch interaction)
    # move once, as in eager.
    for key, buffer in buffers.items():
        assert_close(compiled_buffers[key], buffer)


@pytest.mark.parametrize('name', list(BACKBONES))
def test_compiled_inference_equals_eager(name):
    torch.manual_seed(0)
    model = BACKBONES[name]().eval()
    images = torch.randn(2, 3, *IMAGE_SIZE)
    with torch.no_grad():
        expected = model(images, VALID_SHAPES)
        outs = compiled(model)(images, VALID_SHAPES)
    for out, reference in zip(outs, expected):
        assert_close(out, reference)


def test_each_new_input_size_compiles_one_graph():
    """Valid regions are Python integers that shape the per-image loops:
    dynamo specialises on them, so each new batch shape compiles a graph
    (``dynamic=True`` does not change that) and a seen one reuses it."""
    from torch._dynamo.utils import counters
    model = compiled(BACKBONES['ufo-vit']().eval())
    counters.clear()
    sizes = [(64, 96), (96, 64), (64, 96)]
    with torch.no_grad():
        for height, width in sizes:
            model(torch.randn(2, 3, height, width),
                  [(height, width), (height - 16, width - 32)])
    assert counters['stats']['unique_graphs'] == 2
