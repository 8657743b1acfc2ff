"""SOFT's blocks through the ops' training implementations give the plain
autograd outputs and gradients and keep what they say: every solver,
chunked and in one chunk, with valid regions; which implementation runs
where. The ops alone: ``tests/test_ops.py``.

The plain computation is a copy of the block with its memory-saving switch
off, every operation recorded by autograd as written.
"""
import pytest
import torch

from mmsoft_analysis.saved_tensors import SavedTensorRecorder
from mmsoft.models.common import MLP, regions_on_grid, set_memory_efficient
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
    names = graph_names(out)
    assert 'BaddbmmBackward0' in names
    assert not names & {'NewtonMiddleBackward', 'KernelProductsBackward',
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


class _OnGrid(torch.nn.Module):
    """A block on the 5 x 6 grid, for ``torch.jit.trace``."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x, (5, 6))


def graph_names(out: torch.Tensor) -> set:
    """The names of the autograd nodes behind ``out``."""
    seen, nodes = set(), [out.grad_fn]
    while nodes:
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def test_blocks_train_through_the_ops_and_infer_and_trace_the_reference():
    """Where autograd records, a block runs the ops' training implementations;
    inference on the CPU (``torch.no_grad``), the switch off and tracers
    (``torch.jit.trace``) run the references."""
    block = soft_block().float()
    tokens = torch.randn(1, 30, 16, requires_grad=True)
    trained = graph_names(block(tokens, (5, 6)))
    assert {'NewtonMiddleBackward', 'KernelProductsBackward',
            'LayerNormMLPBackward'} <= trained
    plain = graph_names(set_memory_efficient(soft_block().float(), False)(
        tokens, (5, 6)))
    assert not {'NewtonMiddleBackward', 'KernelProductsBackward',
                'LayerNormMLPBackward'} & plain
    with torch.no_grad():
        inferred = block(tokens, (5, 6))
    traced = torch.jit.trace(_OnGrid(block), tokens.detach(), check_trace=False)
    graph = str(traced.graph)
    assert 'NewtonMiddle' not in graph and 'KernelProducts' not in graph
    torch.testing.assert_close(traced(tokens.detach()), inferred)


@pytest.mark.parametrize('residual', [True, False])
@pytest.mark.parametrize('keep_hidden', [True, False])
def test_layer_norm_then_mlp_equals_plain_autograd(residual, keep_hidden):
    torch.manual_seed(0)
    block = LayerNormThenMLP(8, 32, residual, act_layer=TanhGELU,
                             keep_hidden=keep_hidden).double()
    tokens = 3 + 2 * torch.randn(2, 30, 8, dtype=torch.float64)
    assert_same_as_plain(block, [tokens])
