"""The ops' training implementations (PyTorch on the CPU) against their
references, in float64: SOFT's attention (the Newton inverse of the
bottleneck kernel and the kernel products), UFO-ViT's XNorm attention, the
LayerNorm fused with the layer that reads it and the scaled Linear layer;
what each keeps for backward; and which implementation runs where."""
import pytest
import torch
import torch.nn as nn

from mmsoft.ops import _library, layer_norm_linear, layer_norm_mlp, scaled_linear
import mmsoft.ops.soft as soft_ops
from mmsoft.ops.kernel_inverse import (NewtonMiddle, gaussian_kernel, middle_matrix,
                                       newton_iterations, newton_iterations_backward,
                                       newton_operand, newton_scale, soft_middle,
                                       token_mask)
from mmsoft.ops.soft import KernelProducts, soft_attention
from mmsoft.ops.xnorm import xnorm_attention
from mmsoft.models.common import MLP
from mmsoft_analysis.saved_tensors import SavedTensorRecorder


def generated(*shapes, seed=0, scale=0.5):
    generator = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(*shape, generator=generator, dtype=torch.float64)
            for shape in shapes]


def outputs_and_gradients(function, inputs, seed=1):
    """``function(*inputs)`` and the gradients of a weighted sum of it."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = function(*leaves)
    weights = generated(out.shape, seed=seed, scale=1.)[0]
    (out * weights).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def assert_equal_functions(fused, reference, inputs, rtol=1e-10):
    out, grads = outputs_and_gradients(fused, inputs)
    expected, expected_grads = outputs_and_gradients(reference, inputs)
    scale = expected.abs().max()
    torch.testing.assert_close(out, expected, rtol=rtol, atol=rtol * scale)
    for grad, expected_grad in zip(grads, expected_grads):
        if expected_grad is None:  # an input the function does not read
            assert grad is None
            continue
        scale = expected_grad.abs().max()
        torch.testing.assert_close(grad, expected_grad, rtol=rtol, atol=rtol * scale)


# --- SOFT's attention
@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('chunk', [None, 7])
@pytest.mark.parametrize('counts', [None, [6, 4]])
def test_soft_attention_equals_its_reference(variant, chunk, counts):
    """Queries (2, 2, 30, 8), 6 bottleneck tokens, Newton's 6 steps; image 2
    with 4 tokens of its own (the others pad)."""
    queries, bottleneck, values = generated((2, 2, 30, 8), (2, 2, 6, 8), (2, 2, 30, 8))

    def attention(queries, bottleneck, values, fused):
        return soft_attention(queries, bottleneck, values, 0.7, variant, 'newton', 6,
                              counts, chunk_tokens=chunk, fused=fused)

    assert_equal_functions(lambda *t: attention(*t, True),
                           lambda *t: attention(*t, False),
                           [queries, bottleneck, values])


def test_soft_attention_training_runs_its_functions_and_inference_the_reference():
    queries, bottleneck, values = (t.requires_grad_() for t in generated(
        (1, 2, 30, 8), (1, 2, 6, 8), (1, 2, 30, 8)))
    out = soft_attention(queries, bottleneck, values, 0.7, 'soft++', 'newton', 6)
    assert type(out.grad_fn).__name__ == 'KernelProductsBackward'
    middle = out.grad_fn.next_functions[2][0]
    assert type(middle).__name__ == 'NewtonMiddleBackward'
    plain = soft_attention(queries, bottleneck, values, 0.7, 'soft++', 'newton', 6,
                           fused=False)
    assert type(plain.grad_fn).__name__ == 'UnsafeViewBackward0'
    with torch.no_grad():  # inference on the CPU: one whole kernel evaluation
        inferred = soft_attention(queries, bottleneck, values, 0.7, 'soft++',
                                  'newton', 6)
    torch.testing.assert_close(inferred, out.detach(), rtol=1e-12, atol=1e-12)
    # The CPU's closed form keeps its own autograd function.
    closed = soft_attention(queries, bottleneck, values, 0.7, 'soft++',
                            'newton_closed_form', 6)
    assert 'NewtonMiddleBackward' not in repr(closed.grad_fn.next_functions)


def test_kernel_products_keep_no_query_kernel():
    """Q0, L, middle, V, S and R; no (30 x 6) kernel."""
    queries, bottleneck, middle, values = generated(
        (1, 2, 30, 8), (1, 2, 6, 8), (1, 2, 6, 6), (1, 2, 30, 8))
    queries.requires_grad_()
    with SavedTensorRecorder(nn.Identity()) as recorder:
        KernelProducts.apply(queries, bottleneck, middle, values, 0.7, 30)
    assert sorted(record.shape for record in recorder.records) == sorted([
        (1, 2, 30, 8), (1, 2, 6, 8), (1, 2, 6, 6), (1, 2, 30, 8), (1, 2, 6, 8),
        (1, 2, 6, 8)])


@pytest.mark.parametrize('backward_chunk', [1024, 6])
def test_one_chunk_equals_several_chunks(backward_chunk, monkeypatch):
    """backward_chunk 6: backward slices the one chunk's kernel (and the
    several chunks) into 6-token pieces."""
    monkeypatch.setattr(soft_ops, 'CPU_BACKWARD_CHUNK', backward_chunk)
    inputs = generated((2, 3, 37, 4), (2, 3, 5, 4), (2, 3, 5, 5), (2, 3, 37, 4))
    results = [outputs_and_gradients(
        lambda *t, chunk=chunk: KernelProducts.apply(*t, 0.8, chunk), inputs)
        for chunk in (37, 8)]
    for one, several in zip([results[0][0], *results[0][1]],
                            [results[1][0], *results[1][1]]):
        torch.testing.assert_close(one, several, rtol=1e-10, atol=1e-10)


def test_kernel_products_gradcheck():
    inputs = [t.requires_grad_() for t in generated(
        (1, 2, 9, 2), (1, 2, 3, 2), (1, 2, 3, 3), (1, 2, 9, 2))]
    assert torch.autograd.gradcheck(
        lambda *t: KernelProducts.apply(*t, 0.9, 4), inputs)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('counts', [None, [7, 5]])
def test_newton_middle_equals_the_reference_middle(variant, counts):
    """The step size is a constant of the gradient in both (computed without
    a gradient)."""
    bottleneck, = generated((2, 3, 7, 4))
    inside = None if counts is None else token_mask(counts, 7, 'cpu', torch.float64)

    def reference(tokens):
        kernel = gaussian_kernel(tokens, tokens, float32_products=True)
        return middle_matrix(kernel, variant, 'newton', 5, counts)

    assert_equal_functions(
        lambda tokens: NewtonMiddle.apply(tokens, inside, variant, 5), reference,
        [bottleneck])


def test_newton_middle_keeps_the_tokens_and_step_sizes_alone():
    bottleneck, = generated((2, 3, 12, 4))
    with SavedTensorRecorder(nn.Identity()) as recorder:
        soft_middle(bottleneck.requires_grad_(), 'soft++', 'newton', 20,
                    [12, 9])
    # L (2, 3, 12, 4), its mask (2, 12) and the step sizes (2, 3): no iterate.
    assert sorted(record.shape for record in recorder.records) == [
        (2, 3), (2, 3, 12, 4), (2, 12)]


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('num_iters', [0, 1, 3, 20])
def test_newton_adjoint_is_the_derivative_of_the_iterations(variant, num_iters):
    """:func:`newton_iterations_backward` against autograd through the steps,
    on a symmetric operand and on one that is not (no transpose goes
    unnoticed)."""
    points, = generated((2, 30, 8), scale=0.6)
    mats = gaussian_kernel(points, points)
    alpha = newton_scale(mats, variant)
    weights, = generated(mats.shape, seed=1, scale=1.)
    for operand in (newton_operand(mats, variant),
                    mats + 0.01 * generated(mats.shape, seed=2, scale=1.)[0]):
        leaf = operand.clone().requires_grad_()
        inverse = alpha * leaf
        for _ in range(num_iters):
            inverse = 2 * inverse - inverse @ leaf @ inverse
        (inverse * weights).sum().backward()
        adjoint = newton_iterations_backward(operand, alpha, num_iters, weights)
        torch.testing.assert_close(adjoint, leaf.grad, rtol=1e-10, atol=1e-12)
        if num_iters:
            torch.testing.assert_close(newton_iterations(operand, alpha, num_iters),
                                       inverse.detach(), rtol=1e-12, atol=1e-12)


# --- UFO-ViT's attention
@pytest.mark.parametrize('key_mask', [None, [[True] * 11, [True] * 7 + [False] * 4]])
def test_xnorm_attention_equals_its_reference(key_mask):
    """Three heads of 5 channels; a zero query takes the eps branch."""
    qkv, gammas = generated((2, 11, 45), (2, 3), scale=1.)
    qkv[0, 3, :15] = 0
    mask = None if key_mask is None else torch.tensor(key_mask)

    def attention(projections, gamma_q, gamma_kv, fused):
        return xnorm_attention(projections, 3, gamma_q, gamma_kv, mask, fused=fused)

    assert_equal_functions(lambda *t: attention(*t, True),
                           lambda *t: attention(*t, False),
                           [qkv, 1 + gammas[0], 1 - gammas[1]])


def test_xnorm_attention_keeps_its_projections_and_their_product():
    qkv, = generated((2, 11, 45))
    with SavedTensorRecorder(nn.Identity()) as recorder:
        xnorm_attention(qkv.requires_grad_(), 3, torch.ones(3), torch.ones(3))
    assert sorted(record.shape for record in recorder.records) == [
        (2, 3, 5, 5), (2, 11, 45), (3, ), (3, )]


def test_xnorm_attention_gradcheck():
    qkv, = generated((1, 4, 12))
    gammas = [torch.rand(2, dtype=torch.float64) + 0.5 for _ in range(2)]
    assert torch.autograd.gradcheck(
        lambda *t: xnorm_attention(t[0], 2, *t[1:]),
        [qkv.requires_grad_(), *(g.requires_grad_() for g in gammas)])


# --- The LayerNorm and the layer that reads it
def layer_norm(dims: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(dims).double()
    with torch.no_grad():  # an affine that is not the identity
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    return norm


@pytest.mark.parametrize('keep_hidden', [True, False])
@pytest.mark.parametrize('scaled', [False, True])
def test_layer_norm_mlp_equals_plain_autograd(keep_hidden, scaled):
    torch.manual_seed(0)
    norm, mlp = layer_norm(8), MLP(8, 32, keep_hidden=keep_hidden).double()
    tokens, scale = generated((2, 30, 8), (8, ), scale=2.)

    def run(x, s, fused):
        y, out = layer_norm_mlp(x, norm, mlp, s if scaled else None, fused)
        return y + out

    assert_equal_functions(lambda *t: run(*t, True), lambda *t: run(*t, False),
                           [3 + tokens, scale])


def test_layer_norm_mlp_gradcheck():
    norm, mlp = layer_norm(4), MLP(4, 6).double()
    tokens, scale = generated((3, 4), (4, ))
    params = [norm.weight, norm.bias, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight,
              mlp.fc2.bias]
    assert torch.autograd.gradcheck(
        lambda x, s, *_: sum(layer_norm_mlp(x, norm, mlp, s)),
        (tokens.requires_grad_(), scale.requires_grad_(), *params))


def test_layer_norm_mlp_keeps_the_layer_norms_input_and_fc1s_output():
    """x (30 x 8), its mean and 1/sigma (30 x 1) and fc1's output (30 x 32):
    neither the LayerNorm's output nor the activation's."""
    norm, mlp = nn.LayerNorm(8), MLP(8, 32)
    with SavedTensorRecorder(nn.ModuleList([norm, mlp])) as recorder:
        layer_norm_mlp(torch.randn(30, 8, requires_grad=True), norm, mlp)
    assert sorted(record.shape for record in recorder.records
                  if record.shape[0] == 30) == [(30, 1), (30, 1), (30, 8), (30, 32)]


def test_layer_norm_mlp_with_dropout_runs_plainly():
    norm, mlp = nn.LayerNorm(8), MLP(8, 32, drop=0.5).train()
    tokens = torch.randn(4, 8, requires_grad=True)
    y, out = layer_norm_mlp(tokens, norm, mlp)
    assert type(out.grad_fn).__name__ != 'LayerNormMLPBackward'
    torch.testing.assert_close(y, norm(tokens))


def test_layer_norm_linear_and_scaled_linear_equal_plain_autograd():
    norm, linear = layer_norm(6), nn.Linear(6, 9).double()
    tokens, scale = generated((2, 5, 6), (9, ), scale=2.)
    assert_equal_functions(lambda x: layer_norm_linear(x, norm, linear),
                           lambda x: linear(norm(x)), [3 + tokens])
    assert_equal_functions(lambda x, s: scaled_linear(x, linear, s),
                           lambda x, s: s * linear(x), [tokens[..., :6], scale])
    assert torch.autograd.gradcheck(
        lambda x, s, *_: scaled_linear(x, linear, s),
        (tokens[0].requires_grad_(), scale.requires_grad_(), linear.weight,
         linear.bias))


def test_layer_norm_linear_and_scaled_linear_keep_their_inputs_alone():
    norm, linear = nn.LayerNorm(6), nn.Linear(6, 9)
    tokens = torch.randn(5, 6, requires_grad=True)
    with SavedTensorRecorder(nn.ModuleList([norm, linear])) as recorder:
        layer_norm_linear(tokens, norm, linear)
        scaled_linear(tokens * 1, linear, torch.ones(9, requires_grad=True))
    assert sorted(record.shape for record in recorder.records
                  if record.shape[0] == 5) == [(5, 1), (5, 1), (5, 6), (5, 6)]


# --- Which implementation runs
def test_implementations_by_switch_device_and_tracer(monkeypatch):
    monkeypatch.setattr(_library, 'TRITON_KERNELS', True)  # the switch alone
    on_cpu = torch.zeros(1)
    assert _library.runs_reference(False, on_cpu)
    assert not _library.runs_reference(True, on_cpu)
    with torch.no_grad():  # inference on the CPU
        assert _library.runs_reference(True, on_cpu)
        assert not _library.runs_reference(True, torch.zeros(1, device='meta'))
        with _library.triton_on_cpu():
            assert not _library.runs_reference(True, on_cpu)
    assert not _library.runs_triton(on_cpu)
    assert _library.runs_triton(torch.zeros(1, device='meta')) is False
    with _library.triton_on_cpu():
        assert _library.runs_triton(on_cpu)
    assert not _library.runs_triton(on_cpu)


@pytest.mark.skipif(not _library.HAS_CUSTOM_OPS, reason='torch < 2.4: no custom ops')
def test_every_counted_operation_is_registered():
    assert set(_library.LAUNCHES) == {
        'newton_middle_forward', 'newton_middle_backward', 'kernel_products_forward',
        'kernel_products_backward', 'xnorm_attention_forward',
        'xnorm_attention_backward'}
    for name in _library.LAUNCHES:
        assert hasattr(torch.ops.mmsoft, name)


def test_triton_kernels_need_triton_3():
    """The kernels run where Triton is 3.0 or later; with an older Triton
    (torch 2.1 to 2.3's) the kernels' package refuses to import, saying why,
    and CUDA tensors run the ops' PyTorch implementation."""
    version = _library.triton_version()
    major = int(version.split('.')[0]) if version else 0
    assert _library.TRITON_KERNELS == (major >= 3)
    if _library.TRITON_KERNELS:
        import mmsoft.ops.triton  # noqa: F401
    else:
        with pytest.raises(ImportError, match=r'need Triton 3\.0 or later; this '):
            import mmsoft.ops.triton  # noqa: F401
        with pytest.raises(RuntimeError, match=r'needs Triton 3\.0 or later'):
            with _library.triton_on_cpu():
                pass


@pytest.mark.parametrize('kernels', [True, False])
def test_cuda_runs_the_kernels_only_where_triton_can(monkeypatch, kernels):
    from torch._subclasses.fake_tensor import FakeTensorMode
    try:
        with FakeTensorMode():
            on_cuda = torch.empty(2, device='cuda')
    except RuntimeError as error:  # torch 2.1 asks for a driver
        pytest.skip(f'no fake CUDA tensor without a GPU here: {error}')
    monkeypatch.setattr(_library, 'TRITON_KERNELS', kernels)
    assert _library.runs_triton(on_cuda) is kernels
    assert _library.runs_triton(torch.empty(2)) is False
