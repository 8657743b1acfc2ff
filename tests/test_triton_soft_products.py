"""SOFT's kernel products in Triton (:mod:`mmsoft.ops.triton.soft_products`):
equal to the reference, forward and backward, under Triton's interpreter on
the CPU; their launches counted; and every kernel compiled for sm_80 and
sm_90 at the sizes the models use."""
# First: defines the kernels below for the interpreter where there is no GPU.
from tests.helpers.triton_kernels import (SHARED_MEMORY_LIMITS, compile_for,
                                          count_launches)

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from mmsoft.ops.soft import kernel_products_reference
from mmsoft.ops.triton import soft_products
from mmsoft.ops.triton.soft_products import (LAUNCHES, products_backward,
                                             products_forward)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = ('_token_sum_kernel', '_middle_kernel', '_apply_kernel', '_gradients_kernel',
           '_split_sum_kernel')
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4}


def random_inputs(batch, heads, tokens, m, dims, dtype, seed=0):
    """Q0 and V as views of NCHW maps (as ``SoftAttention.heads`` makes them),
    L, middle, a G laid out as (B, N, h, d), and the scale."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype)

    def heads_of_map():
        return rand(batch, heads * dims, tokens).reshape(
            batch, heads, dims, tokens).transpose(-1, -2)  # (B, h, N, d)

    scale = dims ** -0.25
    queries, values = heads_of_map(), heads_of_map()
    bottleneck = scale * 0.8 * rand(batch, heads, m, dims)
    middle = rand(batch, heads, m, m) / m
    grad_out = rand(batch, tokens, heads, dims).transpose(1, 2)
    return queries, bottleneck, middle, values, grad_out, scale


def reference(queries, bottleneck, middle, values, grad_out, scale):
    """The reference's out, S, R and the gradients of Q0, L, middle and V."""
    inputs = [tensor.detach().clone().requires_grad_()
              for tensor in (queries, bottleneck, middle, values)]
    out = kernel_products_reference(*inputs, scale)
    grads = torch.autograd.grad(out, inputs, grad_out)
    differences = scale * queries[..., :, None, :] - bottleneck[..., None, :, :]
    kernel = torch.exp(-0.5 * differences.pow(2).sum(-1))  # K1: (B, h, N, m)
    summary = kernel.transpose(-1, -2) @ values
    return (out.detach(), summary, middle @ summary) + grads


def assert_close(actual, expected, tolerance, name):
    error = (actual - expected).abs().max().item()
    assert error <= tolerance * expected.abs().max().item(), (
        f'{name}: error {error:.2e}, reference max {expected.abs().max().item():.2e}')


# (B, h, N, m, d, dtype, TARGET_PROGRAMS): tokens not a multiple of any tile;
# m = 1, 6 and 49 (two bottleneck tiles); few target programs give splits of
# several tiles; 160 tokens give more splits than a load of partials adds.
CASES = [
    (1, 2, 37, 1, 16, torch.float64, 256),
    (2, 1, 100, 6, 32, torch.float64, 4),
    (1, 1, 160, 49, 32, torch.float64, 256),
    (2, 1, 100, 49, 16, torch.float32, 8),
    (1, 3, 90, 6, 32, torch.float32, 256),
]


@pytest.mark.parametrize('batch,heads,tokens,m,dims,dtype,programs', CASES)
def test_products_equal_reference(batch, heads, tokens, m, dims, dtype, programs,
                                  monkeypatch):
    monkeypatch.setattr(soft_products, 'TARGET_PROGRAMS', programs)
    queries, bottleneck, middle, values, grad_out, scale = random_inputs(
        batch, heads, tokens, m, dims, dtype)

    out, summary, factor = products_forward(queries, bottleneck, middle, values, scale)
    grads = products_backward(grad_out, queries, bottleneck, middle, values, summary,
                              factor, scale)

    expected = reference(queries, bottleneck, middle, values, grad_out, scale)
    names = ('out', 'summary', 'factor', 'grad_queries', 'grad_bottleneck',
             'grad_middle', 'grad_values')
    for name, actual, wanted in zip(names, (out, summary, factor) + grads, expected):
        assert actual.shape == wanted.shape, name
        assert_close(actual, wanted, TOLERANCES[dtype], name)

    assert out.transpose(1, 2).is_contiguous()  # (B, N, h, d): heads merge as a view
    assert summary.is_contiguous() and factor.is_contiguous()
    assert grads[0].stride() == queries.stride()
    assert grads[3].stride() == values.stride()


def test_launch_counts():
    queries, bottleneck, middle, values, grad_out, scale = random_inputs(
        1, 2, 20, 3, 16, torch.float32)
    with count_launches() as forward:
        out, summary, factor = products_forward(queries, bottleneck, middle, values,
                                                scale)
    with count_launches() as backward:
        products_backward(grad_out, queries, bottleneck, middle, values, summary,
                          factor, scale)

    assert forward.total == forward.triton == LAUNCHES['products_forward'] == 3
    assert backward.total == backward.triton == LAUNCHES['products_backward'] == 4


def test_inputs_checked():
    queries, bottleneck, middle, values, _, scale = random_inputs(1, 2, 20, 4, 16,
                                                                  torch.float64)
    with pytest.raises(ValueError, match='middle has shape'):
        products_forward(queries, bottleneck, middle[..., :3], values, scale)
    with pytest.raises(ValueError, match='values has shape'):
        products_forward(queries, bottleneck, middle, values[:, :, :10], scale)
    with pytest.raises(ValueError, match='bottleneck is torch.float32'):
        products_forward(queries, bottleneck.float(), middle, values, scale)
    with pytest.raises(ValueError, match='queries are torch.bfloat16'):
        products_forward(queries.bfloat16(), bottleneck, middle, values, scale)


# --- Compiled for the GPUs
#: (B, h, N, m, d): stage 1 at 800x1216 with the bottleneck's cap, and many
#: heads with few bottleneck tokens (the least tiles).
MODEL_SIZES = {'m=256': (1, 2, 60800, 256, 32), 'm=6': (8, 4, 3000, 6, 32)}
#: (size, dtype, arch): each kernel compiles for both GPUs in both dtypes,
#: each size and dtype for one of them. A launch asks for the same shared
#: memory on sm_80 and sm_90 (all 28 launches of the four sizes and dtypes,
#: 7 December), so the most (m = 256, float64: 89 KiB) compiles for sm_80,
#: whose limit is the lower.
COMPILED = [('m=256', 'float64', 80), ('m=6', 'float32', 80),
            ('m=6', 'float64', 90), ('m=256', 'float32', 90)]
_POINTER_TYPES = {torch.float32: '*fp32', torch.float64: '*fp64'}


class _Launches:
    """Stands for a kernel: records each launch's arguments and options."""

    def __init__(self, name, kernel):
        self.name, self.kernel, self.calls = name, kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, args, kwargs))


def recorded_launches(sizes, dtype):
    """The launches the host functions make for ``sizes`` (on ``meta`` tensors)."""
    batch, heads, tokens, m, dims = sizes
    meta = dict(device='meta', dtype=dtype)
    queries = torch.empty(batch, heads * dims, tokens, **meta).reshape(
        batch, heads, dims, tokens).transpose(-1, -2)
    bottleneck = torch.empty(batch, heads, m, dims, **meta)
    middle = torch.empty(batch, heads, m, m, **meta)
    records = {name: _Launches(name, getattr(soft_products, name)) for name in KERNELS}
    try:
        for name, record in records.items():
            setattr(soft_products, name, record)
        out, summary, factor = products_forward(queries, bottleneck, middle, queries,
                                                0.4)
        products_backward(out, queries, bottleneck, middle, queries, summary, factor,
                          0.4)
    finally:
        for name, record in records.items():
            setattr(soft_products, name, record.kernel)
    return [call for record in records.values() for call in record.calls]


def signature(kernel, args, kwargs):
    """Triton's signature and constants for a launch: integers equal to 1 are
    constants, as Triton specializes them; Python floats are the annotated
    float64."""
    names = list(inspect.signature(getattr(kernel, 'fn', kernel)).parameters)
    types, constants = {}, {}
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor):
            types[name] = _POINTER_TYPES[value.dtype]
        elif isinstance(value, float):
            types[name] = 'fp64'
        elif value == 1:
            types[name], constants[name] = 'constexpr', 1
        else:
            types[name] = 'i32'
    for name, value in kwargs.items():
        if name not in ('num_warps', 'num_stages'):
            types[name], constants[name] = 'constexpr', value
    return types, constants


def compiled_kernels(cases):
    """Compiles each distinct launch of each case (a size's name, a dtype's and
    an arch) for its arch: a list of dicts."""
    results, seen = [], set()
    for size, dtype, arch in cases:
        for name, args, kwargs in recorded_launches(MODEL_SIZES[size],
                                                    getattr(torch, dtype)):
            types, constants = signature(getattr(soft_products, name), args, kwargs)
            options = dict(num_warps=kwargs['num_warps'],
                           num_stages=kwargs.get('num_stages', 3))
            key = repr((name, types, constants, options, arch))
            if key in seen:  # the forward's and the backward's token sums
                continue
            seen.add(key)
            compiled = compile_for(getattr(soft_products, name), types, constants,
                                   arch, **options)
            results.append(dict(kernel=name, arch=arch, size=size, dtype=dtype,
                                shared=compiled.metadata.shared))
    return results


def test_kernels_compile_for_gpus():
    """:func:`compiled_kernels` of :data:`COMPILED` in a process whose kernels
    are Triton's own: once Triton is imported with the interpreter on, its
    library functions (``tl.sum`` among them) are the interpreter's and do not
    compile."""
    script = ('import json, os, sys, triton, tests.helpers.triton_kernels; '
              'os.environ["TRITON_INTERPRET"] = "0"; '
              'from tests.test_triton_soft_products import compiled_kernels; '
              'print(json.dumps(compiled_kernels(json.loads(sys.argv[1]))))')
    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, '-c', script, json.dumps(COMPILED)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = json.loads(result.stdout.splitlines()[-1])

    for case in COMPILED:
        kernels = {entry['kernel'] for entry in compiled
                   if (entry['size'], entry['dtype'], entry['arch']) == case}
        assert kernels == set(KERNELS), case
    too_large = [entry for entry in compiled
                 if entry['shared'] > SHARED_MEMORY_LIMITS[entry['arch']]]
    assert not too_large
