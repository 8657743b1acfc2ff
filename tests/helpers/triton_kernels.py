"""Running and compiling mmsoft's Triton kernels without a GPU.

Importing this module before Triton's kernels are defined turns on Triton's
interpreter where no CUDA device is (``TRITON_INTERPRET=1``): the kernels
then run on CPU tensors, one program after another, with NumPy.
:func:`count_launches` counts the kernels a host function launches, Triton's
and torch's; :func:`compile_for` compiles a kernel for a GPU architecture
(sm_80, sm_90) without one and returns what it asks of that GPU.
"""
import contextlib
import os
from typing import Dict, Iterator

import pytest
import torch

INTERPRETED = not torch.cuda.is_available()
if INTERPRETED:
    os.environ['TRITON_INTERPRET'] = '1'
# Triton 3.9 warns until this is set; fusing multiply-adds is its default.
os.environ.setdefault('TRITON_DEFAULT_FP_FUSION', '1')

triton = pytest.importorskip('triton', reason='needs Triton')
if tuple(int(part) for part in triton.__version__.split('.')[:2]) < (3, 0):
    pytest.skip(f'Triton {triton.__version__} has no interpreter for these kernels '
                f'(3.0 or later)', allow_module_level=True)

from tests.helpers.kernel_counts import KernelCounter  # noqa: E402

#: Shared memory per block that each GPU architecture grants at most (bytes):
#: A100 (sm_80) 163 KiB, H100 / H200 (sm_90) 227 KiB.
SHARED_MEMORY_LIMITS = {80: 163 * 1024, 90: 227 * 1024}


class _TorchKernels(KernelCounter):
    """torch's kernels outside Triton's: the interpreter's own copies of a
    kernel's arguments, while it runs, launch nothing on a GPU."""

    paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class LaunchCount:
    """The kernels launched inside :func:`count_launches`: Triton's and torch's."""

    def __init__(self):
        self.triton = 0
        self.torch = _TorchKernels(count_cpu=True)

    @property
    def total(self) -> int:
        return self.triton + self.torch.total


@contextlib.contextmanager
def count_launches() -> Iterator[LaunchCount]:
    """Counts the Triton launches (interpreted or compiled) and the torch
    operations that launch a kernel
    (:class:`~tests.helpers.kernel_counts.KernelCounter`)."""
    count = LaunchCount()
    if INTERPRETED:
        from triton.runtime.interpreter import InterpretedFunction
        original = InterpretedFunction.run

        def run(self, *args, **kwargs):
            count.triton += 1
            count.torch.paused = True
            try:
                return original(self, *args, **kwargs)
            finally:
                count.torch.paused = False

        InterpretedFunction.run = run
        try:
            with count.torch:
                yield count
        finally:
            InterpretedFunction.run = original
    else:
        knobs = triton.knobs.runtime
        previous = knobs.launch_enter_hook

        def hook(*args, **kwargs):
            count.triton += 1

        knobs.launch_enter_hook = hook
        try:
            with count.torch:
                yield count
        finally:
            knobs.launch_enter_hook = previous


def compile_for(kernel, signature: Dict[str, str], constexprs: Dict[str, object],
                arch: int, num_warps: int = 4, num_stages: int = 3):
    """``kernel`` compiled for ``sm_<arch>`` (no GPU needed); returns the
    compiled kernel, whose ``metadata.shared`` is its shared memory in bytes.

    ``signature`` names each argument's type (``'*fp32'``, ``'i32'``, ...,
    ``'constexpr'`` for the constants given in ``constexprs``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
    # Under the interpreter the decorated kernel is an InterpretedFunction:
    # compile the Python function it wraps.
    jitted = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
    source = ASTSource(fn=jitted, signature=signature, constexprs=constexprs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(source, target=GPUTarget('cuda', arch, 32), options=options)
