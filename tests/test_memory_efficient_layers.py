"""The memory-saving twins of the blocks, and their autograd functions, give
the plain autograd outputs and gradients and keep what they say: SOFT's
block (every solver, chunked and in one chunk, with valid regions), its
kernel products and Newton iteration, the MLP and the LayerNorm before it.

The plain computation is a copy of the block with its memory-saving switch
off, every operation recorded by autograd as written in its ``forward``.
"""
import pytest
import torch

import mmsoft.models.memory_efficient as memory_efficient
import mmsoft.models.soft as soft
from mmsoft_analysis.saved_tensors import SavedTensorRecorder
from mmsoft.models.common import MLP, regions_on_grid, set_memory_efficient
from mmsoft.models.memory_efficient import (chunked_kernel_product, fold_layer_norm,
                                            layer_norm_mlp, normalize,
                                            recomputed_newton_iterations)
from mmsoft.models.soft import SoftBlock, SoftmaxBlock, TanhGELU

from tests.helpers.plain_autograd import LayerNormThenMLP, assert_same_as_plain


def soft_block(variant='soft++', solver='newton', chunk=None, **kwargs):
    return SoftBlock(16, 2, sr_ratio=2, local_kernel_size=3, variant=variant,
                     solver=solver, newton_iters=6, kernel_chunk_tokens=chunk,
                     **kwargs).double()


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
@pytest.mark.parametrize('chunk', [None, 7, 1000])
def test_soft_block_equals_plain_autograd(variant, solver, chunk):
    torch.manual_seed(0)
    tokens = torch.randn(2, 30, 16, dtype=torch.float64)
    assert_same_as_plain(soft_block(variant, solver, chunk), [tokens], (5, 6))


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form'])
def test_soft_block_with_valid_regions_equals_plain_autograd(variant, solver):
    """Regions whose bottlenecks differ in size (4 and 2 tokens): the Newton
    iteration runs on both images at once, block-diagonally."""
    torch.manual_seed(0)
    tokens = torch.randn(2, 30, 16, dtype=torch.float64)
    regions = regions_on_grid([(5, 6), (4, 4)], (5, 6))
    assert_same_as_plain(soft_block(variant, solver, 7), [tokens], (5, 6), regions)


def test_softmax_block_equals_plain_autograd():
    torch.manual_seed(0)
    tokens = torch.randn(2, 31, 16, dtype=torch.float64)
    regions = regions_on_grid([(5, 6), (3, 4)], (5, 6))
    assert_same_as_plain(SoftmaxBlock(16, 2).double(), [tokens], (5, 6), regions)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('chunk', [30, 7])
def test_chunked_product_and_recomputed_newton_equal_the_plain_products(variant, chunk):
    """``K1 . (middle . (K1^T V))``: float64 outputs and gradients of the
    chunked product and the recomputed iteration equal autograd's through the
    plain products and steps."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return 0.5 * torch.randn(*shape, generator=generator, dtype=torch.float64)

    inputs = [rand(2, 2, 30, 8), rand(2, 2, 6, 8), rand(2, 2, 30, 8)]
    weights = rand(2, 2, 30, 8)

    def kernel_a(bottleneck):
        return soft.gaussian_kernel(bottleneck, bottleneck, float32_products=True)

    def plain(queries, bottleneck, values):
        middle = soft.middle_matrix(kernel_a(bottleneck), variant, 'newton', 6)
        kernel = soft.gaussian_kernel(0.7 * queries, bottleneck)
        return kernel @ (middle @ (kernel.transpose(-1, -2) @ values))

    def saving(queries, bottleneck, values):
        middle = soft.middle_matrix(kernel_a(bottleneck), variant, 'newton', 6,
                                    recomputed_newton_iterations)
        return chunked_kernel_product(queries, bottleneck, middle, values, chunk, 0.7)

    results = []
    for function in (plain, saving):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = function(*leaves)
        (out * weights).sum().backward()
        results.append((out.detach(), [t.grad for t in leaves]))
    (expected, expected_grads), (out, grads) = results
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_soft_block_keeps_no_query_kernel():
    torch.manual_seed(0)
    block = soft_block(solver='exact').float()
    tokens = torch.randn(1, 30, 16, requires_grad=True)
    with SavedTensorRecorder(block) as recorder:
        block(tokens, (5, 6))
    # m = 6 bottleneck tokens (a 2x3 grid), N = 30: no (., 2, 30, 6) kernel.
    assert recorder.records
    assert all(record.shape[-2:] != (30, 6) for record in recorder.records)


def test_plain_soft_block_runs_autograd_through_every_step():
    torch.manual_seed(0)
    block = set_memory_efficient(soft_block().float(), False)
    tokens = torch.randn(1, 30, 16, requires_grad=True)
    with SavedTensorRecorder(block) as recorder:
        out = block(tokens, (5, 6))
    # Autograd keeps K1 (1, 2, 30, 6), and the Newton steps are recorded.
    assert any(record.shape[-2:] == (30, 6) for record in recorder.records)
    seen, nodes = set(), [out.grad_fn]
    while nodes:
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(next_node for next_node, _ in node.next_functions)
    names = {type(node).__name__ for node in seen}
    assert 'BaddbmmBackward0' in names
    assert not names & {'NewtonIterationsBackward', 'ChunkedKernelProductBackward',
                        'LayerNormMLPBackward', 'CheckpointFunctionBackward'}


def test_recorder_groups_by_module_and_refuses_unknown_names():
    torch.manual_seed(0)
    layer = MLP(8, 16)
    with SavedTensorRecorder(layer) as recorder:
        layer(torch.randn(3, 8, requires_grad=True))
    under_fc1 = recorder.records_under('fc1')
    assert under_fc1 and all(r.module == 'fc1' for r in under_fc1)
    assert sum(r.nbytes for r in recorder.records_under('')) == recorder.total_bytes
    with pytest.raises(ValueError, match=r"prefix='fc3' names no module of the "
                       r"model; .*\['fc1', 'act', 'fc2', 'drop'\]"):
        recorder.records_under('fc3')


@pytest.mark.parametrize('backward_chunk', [1024, 6])
def test_one_chunk_backward_equals_several_chunks(backward_chunk, monkeypatch):
    # backward_chunk 6: backward slices the one chunk's kernel (and the
    # several chunks) into 6-token pieces.
    monkeypatch.setattr(soft, 'CPU_BACKWARD_CHUNK', backward_chunk)
    generator = torch.Generator().manual_seed(0)
    inputs = [0.5 * torch.randn(2, 3, n, 4, generator=generator, dtype=torch.float64)
              for n in (37, 5)]
    inputs.insert(2, torch.randn(2, 3, 5, 5, generator=generator, dtype=torch.float64))
    inputs.append(torch.randn(2, 3, 37, 4, generator=generator, dtype=torch.float64))
    grads = []
    for chunk in (37, 8):
        leaves = [t.clone().requires_grad_() for t in inputs]
        chunked_kernel_product(*leaves, chunk).pow(2).sum().backward()
        grads.append([t.grad for t in leaves])
    for one, several in zip(*grads):
        torch.testing.assert_close(one, several, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('residual', [True, False])
@pytest.mark.parametrize('keep_hidden', [True, False])
def test_layer_norm_mlp_equals_plain_autograd(residual, keep_hidden):
    torch.manual_seed(0)
    block = LayerNormThenMLP(8, 32, residual, act_layer=TanhGELU,
                             keep_hidden=keep_hidden).double()
    tokens = 3 + 2 * torch.randn(2, 30, 8, dtype=torch.float64)
    assert_same_as_plain(block, [tokens])


@pytest.mark.parametrize('keep_hidden', [True, False])
def test_layer_norm_mlp_gradcheck(keep_hidden):
    torch.manual_seed(0)
    block = LayerNormThenMLP(4, 6, act_layer=TanhGELU, keep_hidden=keep_hidden).double()
    norm, mlp = block.norm, block.mlp
    tokens = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(4, dtype=torch.float64, requires_grad=True)
    params = [norm.weight, norm.bias, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight,
              mlp.fc2.bias]
    assert torch.autograd.gradcheck(lambda x, *_: layer_norm_mlp(x, norm, mlp, scale),
                                    (tokens, scale, *params))


def test_layer_norm_mlp_keeps_the_normalised_input_only():
    """Neither the LayerNorm's input nor its output: x^ (30 x 8), 1/sigma
    (30 x 1) and fc1's output (30 x 32)."""
    block = LayerNormThenMLP(8, 32, act_layer=TanhGELU)
    tokens = torch.randn(30, 8, requires_grad=True)
    with SavedTensorRecorder(block) as recorder:
        block(tokens)
    assert sorted(record.shape for record in recorder.records) == [
        (30, 1), (30, 8), (30, 32)]


def test_normalize_and_folded_linear_equal_layer_norm_then_linear():
    """``Linear(normalize(x))`` with the LayerNorm's affine folded into the
    weights is ``Linear(LayerNorm(x))``, values and gradients (gradcheck)."""
    torch.manual_seed(0)
    norm, linear = torch.nn.LayerNorm(4).double(), torch.nn.Linear(4, 6).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    tokens = 3 + 2 * torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    params = [norm.weight, norm.bias, linear.weight, linear.bias]

    def folded(x, *_):
        return torch.nn.functional.linear(normalize(x, norm.eps),
                                          *fold_layer_norm(linear, norm))

    torch.testing.assert_close(folded(tokens), linear(norm(tokens)))
    assert torch.autograd.gradcheck(folded, (tokens, *params))


def test_normalize_keeps_its_output_only():
    tokens = torch.randn(30, 8, requires_grad=True)
    with SavedTensorRecorder(torch.nn.Identity()) as recorder:
        out = normalize(tokens * 1, 1e-5)
    assert sorted(record.shape for record in recorder.records) == [(30, 1), (30, 8)]
    assert out.grad_fn.saved_tensors[0].data_ptr() == out.data_ptr()


class _OnGrid(torch.nn.Module):
    """A block on the 5 x 6 grid, for ``torch.jit.trace``."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x, (5, 6))


def test_twin_runs_where_a_gradient_is_recorded_and_no_tracer(monkeypatch):
    """A block hands itself to its twin when its switch is on and autograd
    records; inference (``torch.no_grad``), the switch off and tracers
    (``torch.jit.trace``) run the plain path."""
    calls = []
    twin = memory_efficient.soft_block
    monkeypatch.setattr(SoftBlock, 'twin',
                        staticmethod(lambda *args: calls.append(1) or twin(*args)))
    block = soft_block().float()
    tokens = torch.randn(1, 30, 16)
    block(tokens, (5, 6))
    assert calls == [1]
    with torch.no_grad():
        block(tokens, (5, 6))
    torch.jit.trace(_OnGrid(block), tokens, check_trace=False)
    set_memory_efficient(block, False)(tokens, (5, 6))
    assert calls == [1]


def test_layer_norm_mlp_with_dropout_runs_plainly():
    torch.manual_seed(0)
    norm, mlp = torch.nn.LayerNorm(8), MLP(8, 32, drop=0.5).train()
    tokens = torch.randn(4, 8, requires_grad=True)
    y, out = layer_norm_mlp(tokens, norm, mlp)
    assert type(out.grad_fn).__name__ != 'LayerNormMLPBackward'
    torch.testing.assert_close(y, norm(tokens))
