"""SOFT's kernel inverse in Triton (mmsoft.ops.triton.soft_inverse): under
the interpreter against the PyTorch reference, forward and gradient, in
float64 and float32; its launches; and its kernels compiled for sm_80 and
sm_90."""
from tests.helpers.triton_kernels import (INTERPRETED,  # isort: skip
                                          SHARED_MEMORY_LIMITS, count_launches)

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmsoft.ops.kernel_inverse import gaussian_kernel, middle_matrix, newton_scale
from mmsoft.ops.triton.soft_inverse import (LAUNCHES, inverse_backward,
                                            inverse_forward)

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


def reference(bottleneck, counts, variant, num_iters):
    """``middle`` by mmsoft.models.soft, differentiable in L."""
    kernel_a = gaussian_kernel(bottleneck, bottleneck, float32_products=True)
    return middle_matrix(kernel_a, variant, 'newton', num_iters, token_counts=counts)


def reference_alpha(bottleneck, inside, variant):
    """The step size of :func:`newton_scale` on the masked A: (B, h)."""
    kernel_a = gaussian_kernel(bottleneck, bottleneck, float32_products=True)
    if inside is not None:
        kernel_a = kernel_a * (inside[:, None, :, None] * inside[:, None, None, :])
    alpha = newton_scale(kernel_a, variant)  # (B, h or 1, 1, 1)
    return alpha.reshape(alpha.shape[0], -1).expand(kernel_a.shape[:2])


def bottleneck_tokens(images, heads, tokens, dims, dtype, seed=0):
    """Well-conditioned L (B, h, m, d) as a non-contiguous view (B, m, h, d)."""
    generator = torch.Generator().manual_seed(seed)
    tokens_first = 0.5 * torch.randn(images, tokens, heads, dims,
                                     generator=generator, dtype=torch.float64)
    return tokens_first.to(dtype).transpose(1, 2)


def inside_mask(counts, tokens, dtype):
    """1 for each image's first ``counts[i]`` tokens: (B, m); None without counts."""
    if counts is None:
        return None
    return (torch.arange(tokens)[None] < torch.tensor(counts)[:, None]).to(dtype)


def relative_error(actual, expected):
    """``|actual - expected| / |expected|``; the absolute error where expected is
    zero (one token's A is constant: its gradient is zero)."""
    expected = expected.detach()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


# (variant, B, h, m, token counts or None, k, dtype)
CASES = [
    ('soft', 2, 1, 1, None, 3, torch.float64),
    ('soft', 2, 1, 2, [2, 1], 4, torch.float64),
    ('soft', 1, 2, 3, None, 5, torch.float64),
    ('soft++', 1, 2, 3, None, 3, torch.float64),
    ('soft', 2, 2, 6, [6, 4], 4, torch.float64),
    ('soft++', 2, 2, 6, [6, 4], 4, torch.float64),
    ('soft++', 1, 2, 5, None, 20, torch.float64),
    ('soft++', 2, 1, 49, [49, 30], 3, torch.float64),
    ('soft', 1, 1, 64, None, 3, torch.float64),
    ('soft++', 1, 2, 7, None, 3, torch.float32),
    ('soft', 2, 1, 49, [40, 49], 5, torch.float32),
    ('soft++', 2, 1, 64, [64, 50], 3, torch.float32),
    ('soft++', 1, 1, 100, None, 3, torch.float32),
    ('soft', 1, 1, 100, [70], 3, torch.float32),
]


@pytest.mark.parametrize('variant,images,heads,tokens,counts,num_iters,dtype', CASES)
def test_inverse_and_gradient_match_the_reference(variant, images, heads, tokens,
                                                  counts, num_iters, dtype):
    bottleneck = bottleneck_tokens(images, heads, tokens, 5 if tokens < 49 else 32,
                                   dtype)
    inside = inside_mask(counts, tokens, dtype)
    leaf = bottleneck.detach().requires_grad_()
    expected = reference(leaf, counts, variant, num_iters)
    # Weights without symmetry, as a non-contiguous view.
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64).to(dtype).transpose(-1, -2)
    (expected * weights).sum().backward()

    middle, alpha = inverse_forward(bottleneck, inside, variant, num_iters)
    grad = inverse_backward(weights, bottleneck, inside, alpha, variant, num_iters)

    tolerance = TOLERANCE[dtype]
    assert middle.shape == expected.shape and middle.is_contiguous()
    assert relative_error(middle, expected) < tolerance
    expected_alpha = reference_alpha(bottleneck, inside, variant)
    assert relative_error(alpha, expected_alpha) < tolerance
    assert grad.stride() == bottleneck.stride()
    assert relative_error(grad, leaf.grad) < tolerance


def test_step_size_is_shared_by_the_heads_of_an_image_for_soft_plus():
    bottleneck = bottleneck_tokens(2, 3, 5, 4, torch.float64)
    bottleneck[1] *= 2  # another spread, another step size
    alpha = inverse_forward(bottleneck, None, 'soft++', 1)[1]
    assert (alpha == alpha[:, :1]).all()
    assert alpha[0, 0] != alpha[1, 0]
    alpha = inverse_forward(bottleneck, None, 'soft', 1)[1]
    assert (alpha != alpha[:, :1]).any()


@contextlib.contextmanager
def interpreter_copies_uncounted():
    """Runs the interpreted kernels outside torch's dispatch modes: the
    interpreter's own copies of each tensor argument (``set_``, ``copy_``)
    launch nothing on a GPU."""
    if not INTERPRETED:
        yield
        return
    from torch.utils._python_dispatch import _disable_current_modes
    from triton.runtime.interpreter import InterpretedFunction
    counted_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        with _disable_current_modes():
            return counted_run(self, *args, **kwargs)

    InterpretedFunction.run = run
    try:
        yield
    finally:
        InterpretedFunction.run = counted_run


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_each_host_function_is_one_launch(variant):
    bottleneck = bottleneck_tokens(2, 1, 4, 3, torch.float32)
    inside = inside_mask([4, 3], 4, torch.float32)
    with count_launches() as forward, interpreter_copies_uncounted():
        middle, alpha = inverse_forward(bottleneck, inside, variant, 1)
    grad_middle = torch.ones_like(middle)
    with count_launches() as backward, interpreter_copies_uncounted():
        inverse_backward(grad_middle, bottleneck, inside, alpha, variant, 1)
    assert forward.total == LAUNCHES['inverse_forward'] == 1
    assert backward.total == LAUNCHES['inverse_backward'] == 1


def test_arguments_are_checked():
    bottleneck = bottleneck_tokens(2, 1, 4, 3, torch.float32)
    with pytest.raises(ValueError, match='variant'):
        inverse_forward(bottleneck, None, 'exact', 1)
    with pytest.raises(ValueError, match='num_iters'):
        inverse_forward(bottleneck, None, 'soft', 0)
    with pytest.raises(ValueError, match='inside'):
        inverse_forward(bottleneck, torch.ones(2, 3), 'soft', 1)
    with pytest.raises(ValueError, match='float32 or float64'):
        inverse_forward(bottleneck.half(), None, 'soft', 1)


# --- Compiled for the GPUs
#: (kernel, dtype, arch, variant, masked, m) at d = 32, a covering set (a
#: compile takes 10-20 s): each kernel in both dtypes, on both architectures,
#: in both variants, with and without a mask; at the models' m = 256 (tiles
#: of 64 in float32, 32 in float64) and at a small m (one tile of 16).
COMPILED = [
    ('_inverse_forward_kernel', 'float32', 90, 'soft++', True, 256),
    ('_inverse_forward_kernel', 'float64', 80, 'soft', False, 256),
    ('_inverse_backward_kernel', 'float32', 80, 'soft++', True, 256),
    ('_inverse_backward_kernel', 'float64', 90, 'soft', False, 7),
]

# Triton's own library functions (tl.sum, tl.max) are interpreted in a
# process that runs the interpreter, so the kernels compile in another.
COMPILE_SCRIPT = '''
import json, os, sys
import triton  # TRITON_INTERPRET=0: Triton's library compiles
from tests.helpers.triton_kernels import compile_for  # turns the interpreter on
os.environ['TRITON_INTERPRET'] = '0'
import torch
from mmsoft.ops.triton import soft_inverse

for name, dtype, arch, variant, masked, tokens in json.loads(sys.argv[1]):
    kernel = getattr(soft_inverse, name)
    bottleneck = torch.empty(2, 4, tokens, 32, dtype=getattr(torch, dtype),
                             device='meta')
    inside = bottleneck[:, 0, :, 0] if masked else None
    constexprs = soft_inverse.kernel_constexprs(bottleneck, inside, variant)
    pointer = '*fp64' if dtype == 'float64' else '*fp32'
    signature = {arg: 'constexpr' if arg in constexprs
                 else pointer if arg.endswith('_ptr') else 'i32'
                 for arg in kernel.arg_names}
    compiled = compile_for(kernel, signature, constexprs, arch,
                           soft_inverse.NUM_WARPS, soft_inverse.NUM_STAGES)
    print(json.dumps([name, dtype, arch, variant, masked, tokens,
                      compiled.metadata.shared]), flush=True)
'''


@pytest.fixture(scope='module')
def compiled_shared_memory():
    """Shared memory (bytes) of each configuration of :data:`COMPILED`."""
    env = dict(os.environ, TRITON_INTERPRET='0', PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, '-c', COMPILE_SCRIPT, json.dumps(COMPILED)], cwd=ROOT,
        env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {tuple(line[:-1]): line[-1] for line in lines}


@pytest.mark.parametrize('config', COMPILED,
                         ids=lambda config: '-'.join(map(str, config)))
def test_kernels_compile_for_the_gpus_within_shared_memory(config,
                                                           compiled_shared_memory):
    shared = compiled_shared_memory[config]
    assert 0 < shared <= SHARED_MEMORY_LIMITS[config[2]]
