"""Layers that keep less for backward give the plain autograd outputs and
gradients: SOFT / SOFT++ attention (every solver, chunked and in one chunk),
UFO attention, the local patch interaction and the MLP.

The plain computation is a copy of the layer with the memory-efficient
switch off, i.e. every operation recorded by autograd as written.
"""
import copy
import importlib
from functools import partial

import pytest
import torch

import mmsoft.models.layers as mlp_module
from mmsoft_analysis.saved_tensors import SavedTensorRecorder
from mmsoft.models.soft import SoftAttention
from mmsoft.models.layers import MLP
from mmsoft.models.soft import TanhGELU
from mmsoft.models.ufo_vit import LocalPatchInteraction, UFOAttention
from mmsoft.models.layers import set_memory_efficient
from mmsoft.models.soft import low_rank_kernel_attention as plain_attention
from mmsoft.models.soft_kernels import chunked_kernel_product
from mmsoft.models.soft_kernels import (memory_efficient_kernel_attention as
                                        efficient_attention)
from mmsoft.models.ufo_vit import fold_layer_norm, normalize
from mmsoft.models.functional import recomputed_mlp

# Its BACKWARD_CHUNK is patched below.
kernel_attention_module = importlib.import_module(
    'mmsoft.models.soft_kernels')

from tests.helpers.plain_autograd import LayerNormThenMLP, assert_same_as_plain


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
@pytest.mark.parametrize('chunk', [None, 7, 1000])
def test_soft_attention_equals_plain_autograd(variant, solver, chunk):
    torch.manual_seed(0)
    layer = SoftAttention(16, 2, sr_ratio=2, local_kernel_size=3,
                          variant=variant, solver=solver, newton_iters=6,
                          kernel_chunk_tokens=chunk).double()
    tokens = torch.randn(2, 30, 16, dtype=torch.float64)
    assert_same_as_plain(layer, [tokens], (5, 6))


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
@pytest.mark.parametrize('chunk', [None, 7])
def test_low_rank_kernel_attention_equals_the_plain_function(variant, solver, chunk):
    """The two implementations, called with the same arguments: float64
    outputs and gradients, with and without autograd."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return 0.5 * torch.randn(*shape, generator=generator, dtype=torch.float64)

    inputs = [rand(2, 2, 30, 8), rand(2, 2, 6, 8), rand(2, 2, 30, 8)]
    weights = rand(2, 2, 30, 8)
    results = []
    for function in (plain_attention, partial(efficient_attention, chunk_tokens=chunk)):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = function(*leaves, variant, solver, 6, query_scale=0.7)
        (out * weights).sum().backward()
        with torch.no_grad():
            inferred = function(*inputs, variant, solver, 6, query_scale=0.7)
        results.append((out.detach(), inferred, [t.grad for t in leaves]))
    (plain, plain_inferred, plain_grads), (out, inferred, grads) = results
    torch.testing.assert_close(plain_inferred, plain, rtol=0, atol=0)
    torch.testing.assert_close(out, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(inferred, plain, rtol=1e-12, atol=1e-12)
    for grad, expected in zip(grads, plain_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_soft_attention_keeps_no_query_kernel():
    torch.manual_seed(0)
    attention = SoftAttention(16, 2, sr_ratio=2, local_kernel_size=3,
                              variant='soft++', solver='exact')
    tokens = torch.randn(1, 30, 16, requires_grad=True)
    with SavedTensorRecorder(attention) as recorder:
        attention(tokens, (5, 6))
    # m = 6 bottleneck tokens (a 2x3 grid), N = 30: no (., 2, 30, 6) kernel.
    assert all(record.shape[-2:] != (30, 6) for record in recorder.records)


def test_recorder_groups_by_module_and_refuses_unknown_names():
    torch.manual_seed(0)
    layer = set_memory_efficient(MLP(8, 16), False)
    with SavedTensorRecorder(layer) as recorder:
        layer(torch.randn(3, 8, requires_grad=True))
    under_fc1 = recorder.records_under('fc1')
    assert under_fc1 and all(r.module == 'fc1' for r in under_fc1)
    assert sum(r.nbytes for r in recorder.records_under('')) == recorder.total_bytes
    with pytest.raises(ValueError, match=r"prefix='fc3' names no module of the "
                       r"model; .*\['fc1', 'act', 'fc2', 'drop'\]"):
        recorder.records_under('fc3')


def test_soft_attention_switched_off_runs_plain_autograd():
    torch.manual_seed(0)
    attention = set_memory_efficient(
        SoftAttention(16, 2, sr_ratio=2, local_kernel_size=3, variant='soft++',
                      solver='newton', newton_iters=3), False)
    tokens = torch.randn(1, 30, 16, requires_grad=True)
    with SavedTensorRecorder(attention) as recorder:
        out = attention(tokens, (5, 6))
    # Autograd keeps K1 (1, 2, 30, 6) and the Newton steps are recorded.
    assert any(record.shape[-2:] == (30, 6) for record in recorder.records)
    seen, nodes = set(), [out.grad_fn]
    while nodes:
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(next_node for next_node, _ in node.next_functions)
    names = {type(node).__name__ for node in seen}
    assert not names & {'_NewtonIterationsBackward', 'SymmetricScaleBackward',
                        'ChunkedKernelProductBackward', 'CheckpointFunctionBackward'}


@pytest.mark.parametrize('backward_chunk', [1024, 6])
def test_one_chunk_backward_equals_several_chunks(backward_chunk, monkeypatch):
    # backward_chunk 6: backward slices the one chunk's kernel (and the
    # several chunks) into 6-token pieces.
    monkeypatch.setattr(kernel_attention_module, 'BACKWARD_CHUNK',
                        backward_chunk)
    generator = torch.Generator().manual_seed(0)
    inputs = [0.5 * torch.randn(2, 3, n, 4, generator=generator, dtype=torch.float64)
              for n in (37, 5)]
    inputs.insert(2, torch.randn(2, 3, 5, 5, generator=generator,
                                 dtype=torch.float64))
    inputs.append(torch.randn(2, 3, 37, 4, generator=generator, dtype=torch.float64))
    grads = []
    for chunk in (37, 8):
        leaves = [t.clone().requires_grad_() for t in inputs]
        chunked_kernel_product(*leaves, chunk).pow(2).sum().backward()
        grads.append([t.grad for t in leaves])
    for one, several in zip(*grads):
        torch.testing.assert_close(one, several, rtol=1e-10, atol=1e-10)


def test_ufo_attention_equals_plain_autograd():
    torch.manual_seed(0)
    attention = UFOAttention(16, 2).double()
    with torch.no_grad():
        attention.gamma_q.uniform_(0.5, 2)
        attention.gamma_kv.uniform_(0.5, 2)
    tokens = torch.randn(2, 30, 16, dtype=torch.float64)
    assert_same_as_plain(attention, [tokens])


def test_local_patch_interaction_equals_plain_and_updates_stats_once():
    torch.manual_seed(0)
    lpi = LocalPatchInteraction(8).double().train()
    tokens = torch.randn(2, 30, 8, dtype=torch.float64)
    reference = assert_same_as_plain(lpi, [tokens], (5, 6))
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(lpi.named_buffers())[name], buffer,
                                   rtol=0, atol=0, msg=name)
    assert int(lpi.bn.num_batches_tracked) == 1


@pytest.mark.parametrize('act_layer', [TanhGELU, torch.nn.GELU])
def test_mlp_equals_plain_autograd(act_layer):
    torch.manual_seed(0)
    mlp = MLP(8, 32, act_layer).double()
    tokens = torch.randn(2, 30, 8, dtype=torch.float64)
    assert_same_as_plain(mlp, [tokens])


@pytest.mark.parametrize('keep_hidden', [True, False])
def test_recomputed_mlp_gradcheck(keep_hidden):
    torch.manual_seed(0)
    mlp = MLP(4, 6, TanhGELU).double()
    tokens = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    params = [mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias]
    assert torch.autograd.gradcheck(
        lambda x, *_: recomputed_mlp(x, mlp.fc1.weight, mlp.fc1.bias, mlp.act,
                                     mlp.fc2.weight, mlp.fc2.bias, keep_hidden),
        (tokens, *params))


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

    def both_outputs(x, *_):
        y, out = mlp.forward_normed(x, norm, scale)
        return y, out

    assert torch.autograd.gradcheck(both_outputs, (tokens, scale, *params))


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


@pytest.mark.parametrize('valid_shapes', [None, [(5, 6), (3, 4)]])
def test_ufo_branches_after_layer_norm_equal_plain_autograd(valid_shapes):
    """UFO attention and the local patch interaction given their LayerNorm:
    the memory-efficient path keeps only x^ and equals the plain one."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(8).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    tokens = 1 + torch.randn(2, 30, 8, dtype=torch.float64)
    attention = _AfterNorm(UFOAttention(8, 2).double(), norm)
    lpi = _AfterNorm(LocalPatchInteraction(8).double().train(), norm, (5, 6),
                     valid_shapes)
    assert_same_as_plain(attention, [tokens])
    reference = assert_same_as_plain(lpi, [tokens])
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(lpi.named_buffers())[name], buffer,
                                   rtol=0, atol=1e-12, msg=name)


class _AfterNorm(torch.nn.Module):
    """``layer(x, *args, norm=norm)``."""

    def __init__(self, layer, norm, *args):
        super().__init__()
        self.layer, self.norm, self.args = layer, copy.deepcopy(norm), args

    def forward(self, x):
        return self.layer(x, *self.args, norm=self.norm)


def test_mlp_keeps_no_activation_output():
    mlp = MLP(8, 32, TanhGELU)
    tokens = torch.randn(30, 8, requires_grad=True)
    with SavedTensorRecorder(mlp) as recorder:
        mlp(tokens)
    # The input (30 x 8) and fc1's output (30 x 32), not GELU's output.
    assert sorted(record.shape for record in recorder.records) == [(30, 8), (30, 32)]


def test_plain_path_without_gradient_and_with_dropout(monkeypatch):
    mlp = MLP(8, 32, drop=0.5).train()
    calls = []
    monkeypatch.setattr(mlp_module, 'recomputed_mlp',
                        lambda *args: calls.append(1) or args[0])
    with torch.no_grad():
        mlp(torch.randn(4, 8))
    mlp(torch.randn(4, 8, requires_grad=True))
    assert calls == []
    mlp.eval()(torch.randn(4, 8, requires_grad=True))
    assert calls == [1]
    set_memory_efficient(mlp, False)(torch.randn(4, 8, requires_grad=True))
    assert calls == [1]


def test_memory_efficient_path_follows_the_switch_outside_tracers():
    """The switch on and autograd recording: inference (``torch.no_grad``)
    runs the plain path, SOFT attention's too; never while
    ``torch.jit.trace`` records (tracers see the plain ops)."""
    mlp = MLP(8, 32)
    attention = SoftAttention(16, 2, 2, 3)
    assert mlp.saving_memory()
    assert attention.saving_memory()
    with torch.no_grad():
        assert not mlp.saving_memory()
        assert not attention.saving_memory()
    assert not set_memory_efficient(MLP(8, 32), False).saving_memory()
    decisions = []

    def record_decision(x):
        decisions.append(mlp.saving_memory())
        return 2 * x

    torch.jit.trace(record_decision, torch.randn(3), check_trace=False)
    assert decisions == [False]

