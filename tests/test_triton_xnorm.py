"""The Triton kernels of UFO-ViT's XNorm attention (``mmsoft/ops/triton/xnorm.py``):
outputs and gradients against ``ufo_attention`` under Triton's interpreter on
CPU tensors, their launch counts, and their compilation for sm_80 and sm_90.
"""
# First: turns Triton's interpreter on before the kernels are defined.
from tests.helpers.triton_kernels import (  # isort: skip
    SHARED_MEMORY_LIMITS, compile_for, count_launches)

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from mmsoft.models.common import merge_heads, split_heads
from mmsoft.ops.xnorm import ufo_attention
from mmsoft.ops.triton import xnorm

EPS = 1e-6
#: Relative tolerances of out and of the gradients.
TOLERANCES = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-4)}
#: (embed_dims, num_heads) of UFO-ViT tiny, small, medium and base.
MODEL_SIZES = ((192, 4), (304, 8), (416, 8), (512, 8))
KERNELS = ('_context_partials_kernel', '_context_sum_kernel', '_output_kernel',
           '_query_grad_kernel', '_context_grad_kernel', '_key_value_grad_kernel')
REPO = Path(__file__).resolve().parents[1]


def reference(qkv, num_heads, gamma_q, gamma_kv, key_mask, eps):
    """``ufo_attention`` on qkv's heads, keys zero where ``key_mask`` is False
    (as ``UFOAttention.heads`` masks them): (B, N, C)."""
    queries, keys, values = (split_heads(t, num_heads) for t in qkv.chunk(3, -1))
    if key_mask is not None:
        keys = keys.masked_fill(~key_mask[:, None, :, None], 0.)
    return merge_heads(ufo_attention(queries, keys, values, gamma_q, gamma_kv, eps))


def make_inputs(batch, tokens, num_heads, head_dim, dtype, masked):
    """A strided qkv (B, N, 3C) with the eps branches in it, gammas, a key mask
    with other valid tokens per image, and a strided gradient of out.

    Token 1's query is zero and token 2's has a norm below eps; in head 0 of
    image 0, value column 0 is zero (a zero context column) and column 1 is
    tiny (a context column of norm below eps)."""
    generator = torch.Generator().manual_seed(tokens * 100 + head_dim)
    channels = num_heads * head_dim
    storage = torch.randn(3 * channels, tokens, batch, dtype=dtype,
                          generator=generator)
    qkv = storage.permute(2, 1, 0)  # (B, N, 3C), not contiguous
    qkv[:, 1, :channels] = 0.
    qkv[:, 2, :channels] *= 1e-9
    values = qkv[0, :, 2 * channels:2 * channels + head_dim]  # image 0, head 0
    values[:, 0] = 0.
    values[:, 1] *= 1e-10

    gamma_q, gamma_kv = torch.randn(2, num_heads, dtype=dtype, generator=generator)
    key_mask = None
    if masked:
        key_mask = torch.ones(batch, tokens, dtype=torch.bool)
        key_mask[-1, tokens // 2:] = False
        key_mask[0, 3] = False
    grad_out = torch.randn(batch, channels, tokens, dtype=dtype,
                           generator=generator).transpose(1, 2)  # (B, N, C)
    return qkv, gamma_q, gamma_kv, key_mask, grad_out


def assert_close(actual, expected, rtol, name):
    """Each element within ``rtol`` of the largest magnitude of its column (the
    last dimension) over the tokens, so that the large gradients of a clamped
    norm do not hide the errors of the others."""
    scale = expected.abs().amax(dim=-2 if expected.dim() > 1 else 0, keepdim=True)
    scale = scale.clamp_min(torch.finfo(scale.dtype).tiny)
    error = ((actual - expected).abs() / scale).max().item()
    assert error <= rtol, f'{name}: relative error {error:.2e} > {rtol:.0e}'


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('batch, tokens, num_heads, head_dim, masked', [
    (2, 70, 2, 38, True),  # two splits of one tile each
    (1, 37, 1, 48, False),  # one tile, mostly masked
    (2, 150, 3, 8, True),  # BLOCK_D 16; with TARGET_PROGRAMS 4, splits of 2 tiles
])
def test_matches_reference(batch, tokens, num_heads, head_dim, masked, dtype,
                           monkeypatch):
    monkeypatch.setattr(xnorm, 'TARGET_PROGRAMS', 4)  # several tiles per split
    monkeypatch.setattr(xnorm, 'BLOCK_IMAGES', 1)  # the gammas' sum loops
    qkv, gamma_q, gamma_kv, key_mask, grad_out = make_inputs(
        batch, tokens, num_heads, head_dim, dtype, masked)
    out_tolerance, grad_tolerance = TOLERANCES[dtype]

    out, context = xnorm.xnorm_forward(qkv, num_heads, gamma_q, gamma_kv, key_mask,
                                       EPS)
    grads = xnorm.xnorm_backward(grad_out, qkv, context, num_heads, gamma_q,
                                 gamma_kv, key_mask, EPS)

    leaves = [t.detach().clone().requires_grad_() for t in (qkv, gamma_q, gamma_kv)]
    expected = reference(*leaves[:1], num_heads, *leaves[1:], key_mask, EPS)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    assert out.shape == expected.shape and out.is_contiguous()
    assert_close(out, expected.detach(), out_tolerance, 'out')
    assert grads[0].shape == qkv.shape
    for name, grad, expected_grad in zip(['queries', 'keys', 'values'],
                                         grads[0].chunk(3, -1),
                                         expected_grads[0].chunk(3, -1)):
        assert_close(grad, expected_grad, grad_tolerance, f'grad of {name}')
    for name, grad, expected_grad in zip(['gamma_q', 'gamma_kv'], grads[1:],
                                         expected_grads[1:]):
        assert grad.dtype == expected_grad.dtype
        assert_close(grad, expected_grad, grad_tolerance, f'grad of {name}')


def test_eps_branches_are_taken():
    """The inputs of :func:`test_matches_reference` clamp a query's norm and a
    context column's norm, and leave a column zero."""
    qkv, _, _, key_mask, _ = make_inputs(2, 70, 2, 38, torch.float64, True)
    queries, keys, values = (split_heads(t, 2) for t in qkv.chunk(3, -1))
    keys = keys.masked_fill(~key_mask[:, None, :, None], 0.)
    query_norms = queries.norm(dim=-1)
    column_norms = (keys.transpose(-2, -1) @ values).norm(dim=-2)  # (B, h, d)
    assert (query_norms[:, :, 1] == 0).all()
    assert (query_norms[:, :, 2] > 0).all() and (query_norms[:, :, 2] < EPS).all()
    assert column_norms[0, 0, 0] == 0 and 0 < column_norms[0, 0, 1] < EPS


@pytest.mark.parametrize('masked', [True, False])
def test_launch_counts(masked):
    qkv, gamma_q, gamma_kv, key_mask, grad_out = make_inputs(
        2, 20, 2, 8, torch.float32, masked)
    with count_launches() as forward:
        out, context = xnorm.xnorm_forward(qkv, 2, gamma_q, gamma_kv, key_mask, EPS)
    with count_launches() as backward:
        xnorm.xnorm_backward(grad_out, qkv, context, 2, gamma_q, gamma_kv, key_mask,
                             EPS)
    # Under the interpreter, count_launches also counts the interpreter's own
    # copies of the arguments: the host's torch operations are counted with
    # the kernels stubbed out.
    with _recording([]), count_launches() as torch_operations:
        xnorm.xnorm_forward(qkv, 2, gamma_q, gamma_kv, key_mask, EPS)
        xnorm.xnorm_backward(grad_out, qkv, context, 2, gamma_q, gamma_kv, key_mask,
                             EPS)
    assert torch_operations.total == 0
    assert forward.triton == xnorm.LAUNCHES['xnorm_forward'] == 3
    assert backward.triton == xnorm.LAUNCHES['xnorm_backward'] == 3


@pytest.mark.parametrize('dtype, key_mask_shape, match', [
    (torch.float16, None, 'dtype'),
    (torch.float32, (2, 5), 'key_mask'),
])
def test_invalid_inputs(dtype, key_mask_shape, match):
    qkv = torch.zeros(2, 4, 12, dtype=dtype)
    key_mask = None if key_mask_shape is None else torch.ones(key_mask_shape,
                                                              dtype=torch.bool)
    with pytest.raises(ValueError, match=match):
        xnorm.xnorm_forward(qkv, 2, torch.ones(2), torch.ones(2), key_mask, EPS)


# --- Compilation for the GPUs
class _Recorder:
    """Stands in for a kernel: records its launches instead of running them."""

    def __init__(self, kernel, launches: list):
        self.kernel = kernel
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


@contextmanager
def _recording(launches: list):
    originals = {name: getattr(xnorm, name) for name in KERNELS}
    for name, kernel in originals.items():
        setattr(xnorm, name, _Recorder(kernel, launches))
    try:
        yield
    finally:
        for name, kernel in originals.items():
            setattr(xnorm, name, kernel)


def recorded_launches(dtype: torch.dtype, masked: bool, matmul_precision: str) -> list:
    """The kernels and arguments the host functions launch at the models' sizes
    (batch 2, 96 x 96 tokens), run on meta tensors under torch's float32 matmul
    precision ``matmul_precision``."""
    launches = []
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul_precision)
    try:
        for channels, num_heads in MODEL_SIZES:
            qkv = torch.empty(2, 96 * 96, 3 * channels, dtype=dtype, device='meta')
            gamma = torch.empty(num_heads, dtype=dtype, device='meta')
            key_mask = torch.empty(2, 96 * 96, dtype=torch.bool, device='meta') \
                if masked else None
            with _recording(launches):
                out, context = xnorm.xnorm_forward(qkv, num_heads, gamma, gamma,
                                                   key_mask, EPS)
                xnorm.xnorm_backward(out, qkv, context, num_heads, gamma, gamma,
                                     key_mask, EPS)
    finally:
        torch.set_float32_matmul_precision(previous)
    return launches


def _signature(kernel, args, constexprs) -> dict:
    types = {torch.float32: '*fp32', torch.float64: '*fp64', torch.bool: '*i1'}
    values = dict(zip(kernel.arg_names, args))
    return {name: 'constexpr' if name in constexprs
            else types[values[name].dtype] if isinstance(values[name], torch.Tensor)
            else 'i32' for name in kernel.arg_names}


#: The launches compiled for each GPU: (dtype, key mask, torch's float32
#: matmul precision). TF32 compiles for both, as its products take the GPU's
#: own instructions and shared memory (sm_90's 112 KiB against sm_80's
#: 80 KiB). The exact float32 and float64 products ask for the same shared
#: memory on both (all 36 compilations of the four variants, 7 December), so
#: each compiles once, float64's, which asks for the most (104 KiB), for
#: sm_80, whose limit is the lower.
COMPILED = {80: [(torch.float32, True, 'highest'), (torch.float32, True, 'high'),
                 (torch.float64, True, 'highest')],
            90: [(torch.float32, True, 'high'), (torch.float32, False, 'highest')]}


def compile_kernels(arch: int) -> list:
    """Compiles each kernel for ``sm_<arch>`` with the constants the host
    functions pass at the models' sizes, in the variants of
    :data:`COMPILED`. Returns one dict per distinct compilation: the kernel's
    name, its dtype, its constants and its shared memory in bytes.

    Runs where Triton was imported without its interpreter: under it, the
    kernels' @triton.jit helpers and Triton's own (tl.sum) cannot compile."""
    os.environ.pop('TRITON_INTERPRET', None)
    launches = []
    for dtype, masked, matmul_precision in COMPILED[arch]:
        launches += recorded_launches(dtype, masked, matmul_precision)
    compiled = {}
    for kernel, args, kwargs in launches:
        options = {key: kwargs.pop(key) for key in ('num_warps', 'num_stages')
                   if key in kwargs}
        signature = _signature(kernel, args, kwargs)
        key = (kernel.fn.__name__, repr(signature), repr(kwargs), repr(options))
        if key not in compiled:
            binary = compile_for(kernel, signature, kwargs, arch, **options)
            compiled[key] = dict(kernel=kernel.fn.__name__, dtype=str(args[0].dtype),
                                 constexprs=kwargs, shared=binary.metadata.shared,
                                 arch=arch)
    return list(compiled.values())


_COMPILE = """
import json
import mmsoft.ops.triton.xnorm  # defined before the interpreter is turned on
from tests.test_triton_xnorm import compile_kernels
print(json.dumps(compile_kernels(80) + compile_kernels(90)))
"""


def test_kernels_compile_for_the_gpus():
    environment = {key: value for key, value in os.environ.items()
                   if key != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, '-c', _COMPILE], cwd=REPO,
                            env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = json.loads(result.stdout.splitlines()[-1])

    dtypes = {80: ('torch.float32', 'torch.float64'), 90: ('torch.float32',)}
    for arch, names in dtypes.items():
        assert {(entry['kernel'], entry['dtype']) for entry in compiled
                if entry['arch'] == arch} == {
            (kernel, dtype) for kernel in KERNELS for dtype in names}
    precisions = {(entry['arch'], entry['constexprs'].get('PRECISION'))
                  for entry in compiled}
    assert precisions == {(80, 'ieee'), (80, 'tf32'), (80, None), (90, 'tf32'),
                          (90, 'ieee'), (90, None)}
    for entry in compiled:
        assert entry['shared'] <= SHARED_MEMORY_LIMITS[entry['arch']], entry
