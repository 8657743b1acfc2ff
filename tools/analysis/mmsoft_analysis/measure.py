"""Latency and peak memory of one backbone at one input size.

Run once per (backbone, size) in a fresh process (see
``tools/analysis/benchmark.py``) so that memory of earlier runs does not mask
the peak. On CPU the peak is the growth of the process's resident set
high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) during one
forward (or forward + backward); on CUDA it is
``torch.cuda.max_memory_allocated`` above the memory held before the call.

The resident set also holds memory glibc's allocator keeps after it is
freed (it raises its mmap threshold as large blocks are freed and keeps heap
memory mapped), so on CPU it overstates what the tensors need, by however
much the allocation pattern fragments the heap. With ``--live-memory`` the
worker first fixes glibc's mmap threshold (:func:`track_live_memory`): every
allocation of 64 KiB or more is then its own mapping, returned on free, and
the high-water mark is the peak of live memory, the figure CUDA's
``max_memory_allocated`` gives on a GPU. That worker measures memory only:
the extra mappings slow it down.
"""
import argparse
import contextlib
import ctypes
import ctypes.util
import json
import statistics
import time
from typing import Callable, Dict, Optional, Tuple

import torch


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LIVE_MEMORY_THRESHOLD = 64 * 1024


def track_live_memory() -> None:
    """Makes this process's resident set follow its live allocations.

    Fixes glibc's mmap threshold at 64 KiB, which also turns off its dynamic
    raising: larger blocks are mapped on allocation and unmapped on free.

    Raises:
        RuntimeError: When the C library does not accept the setting (not
            glibc).
    """
    libc = ctypes.CDLL(ctypes.util.find_library('c'))
    if libc.mallopt(M_MMAP_THRESHOLD, LIVE_MEMORY_THRESHOLD) != 1:
        raise RuntimeError('mallopt(M_MMAP_THRESHOLD) failed: --live-memory needs '
                           'glibc on Linux.')


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not found in /proc/self/status')


def reset_peak_rss() -> None:
    """Resets the resident-set high-water mark of this process (Linux)."""
    with open('/proc/self/clear_refs', 'w') as clear_refs:
        clear_refs.write('5')


def _synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast_to(device: torch.device, dtype: Optional[torch.dtype]):
    """``torch.autocast`` to ``dtype`` on ``device``'s type; no autocast
    (a null context) when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def run_once(model, images: torch.Tensor, backward: bool,
             autocast_dtype: Optional[torch.dtype] = None) -> None:
    """One forward (no grad) or forward + backward of ``model``.

    Args:
        model (nn.Module): A backbone returning a sequence of maps.
        images (Tensor): (B, 3, H, W) input.
        backward (bool): Forward + backward of the sum of the maps' means
            (gradients dropped after) instead of a forward without gradients.
        autocast_dtype (torch.dtype, optional): Run the forward under
            ``torch.autocast`` to this dtype (the backward runs outside it,
            as autocast prescribes). None runs in the model's dtype.
            Default: None.
    """
    autocast = autocast_to(images.device, autocast_dtype)
    if backward:
        with autocast:
            outputs = model(images)
        sum(out.float().mean() for out in outputs).backward()
        model.zero_grad(set_to_none=True)
        return
    with torch.no_grad(), autocast:
        model(images)


def peak_memory_of(call: Callable[[], object], device: torch.device) -> int:
    """Memory held at the peak of ``call()``, above what was held before it.

    Args:
        call (callable): The work to measure, without arguments.
        device (torch.device): Where it runs: CUDA's allocator is asked on a
            GPU, the process's resident set on CPU.

    Returns:
        int: Bytes.
    """
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    reset_peak_rss()
    before = _status_kib('VmRSS')
    call()
    return (_status_kib('VmHWM') - before) * 1024


def seconds_of(call: Callable[[], object], device: torch.device) -> float:
    """Wall time of one ``call()``, the device synchronised before and after
    (e.g. the first call of a compiled model: its compile time)."""
    _synchronize(device)
    start = time.perf_counter()
    call()
    _synchronize(device)
    return time.perf_counter() - start


def call_times(call: Callable[[], object], device: torch.device, warmup: int,
               repeats: int) -> Tuple[list, list]:
    """Wall and CPU times of ``repeats`` calls after ``warmup`` calls.

    The CPU time is the process's (all threads); on a machine shared with
    other jobs it is less disturbed than the wall time.

    Returns:
        tuple[list, list]: Wall seconds and CPU seconds of each timed call.
    """
    for _ in range(warmup):
        call()
    wall, cpu = [], []
    for _ in range(repeats):
        _synchronize(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        _synchronize(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def timing_fields(call: Callable[[], object], device: torch.device, warmup: int,
                  repeats: int) -> Dict:
    """``seconds`` (median wall), ``all_seconds``, ``cpu_seconds`` (fastest)
    and ``all_cpu_seconds`` of ``repeats`` calls, for a result dict."""
    wall, cpu = call_times(call, device, warmup, repeats)
    return dict(seconds=statistics.median(wall), all_seconds=wall,
                cpu_seconds=min(cpu), all_cpu_seconds=cpu)


def peak_memory_bytes(model, images: torch.Tensor, backward: bool) -> int:
    """Memory held at the peak of one call, above what was held before it."""
    return peak_memory_of(lambda: run_once(model, images, backward), images.device)


def matmul_throughput(size: int = 2048, repeats: int = 5, device='cpu') -> float:
    """Dense float32 matmul throughput of this machine, multiply-adds/second."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b
    best = float('inf')
    for _ in range(repeats):
        _synchronize(torch.device(device))
        start = time.perf_counter()
        a @ b
        _synchronize(torch.device(device))
        best = min(best, time.perf_counter() - start)
    return size**3 / best


def measure(spec: str, shape: Tuple[int, int], device: str = 'cpu',
            backward: bool = False, warmup: int = 1, repeats: int = 3,
            flops: bool = False, batch: int = 1,
            compile_backend: Optional[str] = None) -> Dict:
    """Builds the backbone ``spec`` and measures it at ``shape``.

    Args:
        spec (str): Backbone spec (see :mod:`mmsoft_analysis.peers`).
        shape (tuple[int, int]): Input (H, W).
        device (str): ``'cpu'`` or ``'cuda'``. Default: ``'cpu'``.
        backward (bool): Time forward + backward (training: the backbone in
            train mode, the sum of its outputs' means as the loss) instead of
            forward. Default: False.
        warmup (int): Untimed calls first. Default: 1.
        repeats (int): Timed calls; 0 measures memory only. Default: 3.
        flops (bool): Also count FLOPs (mmsoft's handles). Default: False.
        batch (int): Images per call. Default: 1.
        compile_backend (str, optional): Measure ``torch.compile(model,
            backend=compile_backend)`` instead, after a first call that
            compiles it (``compile_seconds``). Default: None (eager).

    Returns:
        dict: ``seconds`` (median), ``all_seconds``, ``cpu_seconds``
        (fastest), ``all_cpu_seconds``, ``peak_bytes``,
        ``params``, ``compile`` (the backend or None), when compiled
        ``compile_seconds`` (the first call's) and, with ``flops``,
        ``gflops`` (of the eager model).
    """
    from .peers import build_backbone
    torch.manual_seed(0)
    model = build_backbone(spec).to(device)
    if backward:
        model.train()
    images = torch.randn(batch, 3, *shape, device=device)
    result = dict(model=spec, height=shape[0], width=shape[1], device=device,
                  mode='forward+backward' if backward else 'forward', batch=batch,
                  threads=torch.get_num_threads(),
                  params=sum(p.numel() for p in model.parameters()),
                  compile=compile_backend)
    eager = model
    if compile_backend is not None:
        model = torch.compile(model, backend=compile_backend)
        _synchronize(images.device)
        start = time.perf_counter()
        run_once(model, images, backward)  # compiles
        _synchronize(images.device)
        result['compile_seconds'] = time.perf_counter() - start
    result['peak_bytes'] = peak_memory_bytes(model, images, backward)
    if repeats > 0:
        result.update(timing_fields(lambda: run_once(model, images, backward),
                                    images.device, warmup, repeats))
    if flops:
        from mmsoft_analysis.flop_handles import count_flops
        eager.eval()
        with torch.no_grad():
            total, _ = count_flops(eager, (images, ))
        result['gflops'] = total / 1e9
    return result


def add_live_memory_flag(parser: argparse.ArgumentParser) -> None:
    """Adds a worker's ``--live-memory`` flag."""
    parser.add_argument('--live-memory', action='store_true',
                        help='measure the peak of live memory only (see '
                        'track_live_memory); no timing')


def start_worker(args: argparse.Namespace) -> None:
    """With ``--live-memory``: tracks live memory and times nothing."""
    if args.live_memory:
        track_live_memory()
        args.warmup, args.repeats = 0, 0


def main():
    """Worker entry point: measures one (spec, size) and prints JSON."""
    parser = argparse.ArgumentParser(description='Measure one backbone once.')
    parser.add_argument('spec')
    parser.add_argument('height', type=int)
    parser.add_argument('width', type=int)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--backward', action='store_true')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--flops', action='store_true')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--compile', default=None, metavar='BACKEND',
                        help='measure torch.compile(model, backend=BACKEND)')
    add_live_memory_flag(parser)
    args = parser.parse_args()
    start_worker(args)
    result = measure(args.spec, (args.height, args.width), args.device,
                     args.backward, args.warmup, args.repeats, args.flops,
                     args.batch, args.compile)
    print('RESULT ' + json.dumps(result))


if __name__ == '__main__':
    main()

