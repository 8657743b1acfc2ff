"""SOFT variant against a direct dense computation of its formula."""
import pytest
import torch
import torch.nn.functional as F

from mmsoft.models.common import set_memory_efficient
from mmsoft.models.soft import SoftAttention, SoftBlock, capped_grid_size


def dense_soft_attention(module, x, hw_shape):
    """Direct per-head evaluation of the SOFT formula, with explicit loops.

    ``out = ff(K1 M K1^T V + DWConv(V))``: K1 from pairwise distances of the
    scaled queries and the bottleneck tokens, M the inverse of the bottleneck
    kernel (regularised, or symmetric-normalised pseudo-inverse for SOFT++).
    """
    batch, tokens, channels = x.shape
    heads = module.num_heads
    dims = channels // heads
    height, width = hw_shape
    queries = F.linear(x, module.q_proj.weight, module.q_proj.bias)
    values = F.linear(x, module.v_proj.weight, module.v_proj.bias)
    out = torch.zeros_like(values)
    for b in range(batch):
        for h in range(heads):
            q = queries[b, :, h * dims:(h + 1) * dims] / dims**0.25  # (N, d)
            v = values[b, :, h * dims:(h + 1) * dims]  # (N, d)
            grid = q.T.reshape(1, dims, height, width)
            grid = F.conv2d(grid, module.bottleneck_conv.weight,
                            stride=module.bottleneck_conv.stride)
            rows, cols = capped_grid_size(*grid.shape[-2:],
                                          module.max_bottleneck_tokens)
            grid = F.adaptive_avg_pool2d(grid, (rows, cols))
            marks = grid.reshape(dims, -1).T  # (m, d)
            marks = F.gelu(F.layer_norm(marks, (dims, ),
                                        module.bottleneck_norm.weight,
                                        module.bottleneck_norm.bias))
            k1 = torch.exp(-0.5 * torch.cdist(q, marks)**2)  # (N, m)
            a = torch.exp(-0.5 * torch.cdist(marks, marks)**2)  # (m, m)
            eye = torch.eye(a.shape[0], dtype=a.dtype)
            if module.variant == 'soft':
                middle = torch.linalg.inv(a + 0.01 * eye)
            else:
                d_inv_sqrt = torch.diag(a.sum(1).rsqrt())
                middle = d_inv_sqrt @ torch.linalg.pinv(a) @ d_inv_sqrt
            local = F.conv2d(v.T.reshape(dims, 1, height, width),
                             module.local_conv.weight[h:h + 1],
                             padding=module.local_conv.padding)
            out[b, :, h * dims:(h + 1) * dims] = (k1 @ middle @ k1.T @ v +
                                                  local.reshape(dims, -1).T)
    return F.linear(out, module.out_proj.weight, module.out_proj.bias)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('max_tokens', [None, 6])
def test_matches_dense_reference(variant, max_tokens):
    torch.manual_seed(0)
    hw_shape = (9, 13)
    module = SoftAttention(64, 2, sr_ratio=2, local_kernel_size=5,
                           variant=variant, solver='exact',
                           max_bottleneck_tokens=max_tokens).double()
    x = torch.randn(2, 9 * 13, 64, dtype=torch.float64)
    expected = dense_soft_attention(module, x, hw_shape)
    torch.testing.assert_close(module(x, hw_shape), expected, atol=1e-8, rtol=1e-6)


def test_newton_matches_reference_within_tolerance():
    torch.manual_seed(1)
    module = SoftAttention(64, 2, sr_ratio=4, local_kernel_size=3,
                           variant='soft', solver='newton').double()
    x = torch.randn(1, 16 * 12, 64, dtype=torch.float64)
    expected = dense_soft_attention(module, x, (16, 12))
    torch.testing.assert_close(module(x, (16, 12)), expected, atol=1e-5, rtol=1e-4)


def test_bottleneck_cap_bounds_tokens_and_keeps_small_grids():
    assert capped_grid_size(7, 7, 256) == (7, 7)  # 224x224: untouched
    rows, cols = capped_grid_size(25, 42, 256)  # 800x1333
    assert rows * cols <= 256 and rows * cols >= 200
    assert capped_grid_size(1, 1000, 64) == (1, 64)
    assert capped_grid_size(50, 50, None) == (50, 50)


class _OnGrid(torch.nn.Module):

    def __init__(self, layer, hw_shape):
        super().__init__()
        self.layer = layer
        self.hw_shape = hw_shape

    def forward(self, x):
        return self.layer(x, self.hw_shape)


def test_export_formulation_pools_with_tensor_sizes_and_iterates():
    # Traced in the ONNX export formulation, the cap pools by averaging
    # matrices on traced sizes and the closed form runs as the iteration:
    # the same sizes and, up to rounding, the same values. A plain trace
    # (FLOP counting) records the pooling matrix of this size and the
    # closed form's node.
    from mmsoft.deployment.onnx_export import export_formulation
    torch.manual_seed(0)
    module = SoftAttention(64, 2, sr_ratio=2, local_kernel_size=3,
                           variant='soft++', solver='newton_closed_form',
                           max_bottleneck_tokens=6).eval()
    x = torch.randn(1, 9 * 13, 64)
    with torch.no_grad():
        expected = module(x, (9, 13))
        plain = torch.jit.trace(_OnGrid(module, (9, 13)), (x, ), check_trace=False)
        with export_formulation(module):
            traced = torch.jit.trace(_OnGrid(module, (9, 13)), (x, ), check_trace=False)
        torch.testing.assert_close(traced(x), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(module(x, (9, 13)), expected, rtol=0, atol=0)
    graph, plain_graph = str(traced.inlined_graph), str(plain.inlined_graph)
    assert 'adaptive_avg_pool2d' not in graph and '_shape_as_tensor' in graph
    assert 'PythonOp' not in graph and 'aten::matmul' in graph
    assert '_shape_as_tensor' not in plain_graph  # a constant pooling matrix
    assert 'NewtonClosedForm' in plain_graph
    assert not module.exportable  # restored on exit


def spy_on_implementations(monkeypatch):
    """Records which implementation of the kernel products runs (plain or
    memory-saving), with the dtypes of its tensor inputs and output."""
    import mmsoft.ops.soft as soft_ops
    seen = []

    def spy(name, original):

        def implementation(*args):
            out = original(*args)
            dtypes = [arg.dtype for arg in args if isinstance(arg, torch.Tensor)]
            seen.append((name, *dtypes, out.dtype))
            return out

        return implementation

    class KernelProducts:
        apply = staticmethod(spy('memory_efficient', soft_ops.KernelProducts.apply))

    monkeypatch.setattr(soft_ops, 'kernel_products_reference',
                        spy('plain', soft_ops.kernel_products_reference))
    monkeypatch.setattr(soft_ops, 'KernelProducts', KernelProducts)
    return seen


@pytest.mark.parametrize('memory_efficient', [True, False])
def test_autocast_runs_kernel_in_float32(memory_efficient, monkeypatch):
    torch.manual_seed(0)
    block = set_memory_efficient(SoftBlock(64, 2, sr_ratio=2, local_kernel_size=3),
                                 memory_efficient)
    seen = spy_on_implementations(monkeypatch)
    x = torch.randn(1, 64, 64)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = block(x, (8, 8))
    name = 'memory_efficient' if memory_efficient else 'plain'
    assert seen == [(name, ) + (torch.float32, ) * 5]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_tracers_see_the_plain_implementation(monkeypatch):
    torch.manual_seed(0)
    block = SoftBlock(16, 2, sr_ratio=2, local_kernel_size=3).train()
    seen = spy_on_implementations(monkeypatch)
    x = torch.randn(1, 8 * 8, 16)
    traced = torch.jit.trace(_OnGrid(block, (8, 8)), (x, ), check_trace=False)
    assert [record[0] for record in seen] == ['plain']
    torch.testing.assert_close(traced(x), block(x, (8, 8)), rtol=1e-5, atol=1e-6)
    assert [record[0] for record in seen] == ['plain', 'memory_efficient']


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match='embed_dims=64 is not divisible by '
                       'num_heads=3'):
        SoftAttention(64, 3, 2, 3)


def test_options_are_validated_at_construction():
    with pytest.raises(ValueError, match="variant='softmax'"):
        SoftAttention(64, 2, 2, 3, variant='softmax')
    with pytest.raises(ValueError, match="solver='lu'"):
        SoftAttention(64, 2, 2, 3, solver='lu')
    with pytest.raises(ValueError, match="solver='cholesky' is not supported"):
        SoftAttention(64, 2, 2, 3, solver='cholesky')


def test_chunked_kernel_gives_same_output_and_gradients():
    torch.manual_seed(0)
    plain = SoftBlock(64, 2, sr_ratio=2, local_kernel_size=3)
    chunked = SoftBlock(64, 2, sr_ratio=2, local_kernel_size=3, kernel_chunk_tokens=10)
    chunked.load_state_dict(plain.state_dict())
    x = torch.randn(2, 12 * 10, 64)
    outs = []
    for module in (plain, chunked):
        out = module(x, (12, 10))
        out.square().sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(plain.attn.q_proj.weight.grad,
                               chunked.attn.q_proj.weight.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(plain.attn.bottleneck_conv.weight.grad,
                               chunked.attn.bottleneck_conv.weight.grad,
                               atol=1e-4, rtol=1e-4)
