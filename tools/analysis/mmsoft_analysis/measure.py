"""One measurement in one process: a model built once, then each of its
settings (mode and precision) stepped, timed and measured (docs/benchmarks.md).

Run as ``python -m mmsoft_analysis.measure JSON`` it measures one case of
:mod:`.runner` and prints one ``RESULT {json}`` line per record.
"""
import ctypes
import ctypes.util
import gc
import json
import math
import re
import sys
import time
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch
import torch.nn as nn

MIB = 2**20
#: AdamW as mmdet's Swin-T Mask R-CNN config sets it up.
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)
#: Host calls that launch work on a GPU.
LAUNCH_CALL = re.compile(r'^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)')


def canvas(shapes: Sequence[Tuple[int, int]], pad: int) -> Tuple[int, int]:
    """(H, W) of a batch of images of ``shapes``: each side's largest,
    rounded up to a multiple of ``pad``."""
    return tuple(-(-max(s[i] for s in shapes) // pad) * pad for i in (0, 1))


def images_of(shapes: Sequence[Tuple[int, int]], pad: int,
              device: torch.device) -> torch.Tensor:
    """Random images of ``shapes`` on one :func:`canvas`, zero outside each
    image (as mmdet pads them)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.zeros(len(shapes), 3, *canvas(shapes, pad))
    for index, (height, width) in enumerate(shapes):
        images[index, :, :height, :width] = torch.randn(3, height, width,
                                                        generator=generator)
    return images.to(device)


def maps_loss(images: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    """A backbone's training loss on ``images``: the sum of its maps' means."""
    return lambda model: sum(f.float().mean() for f in model(images))


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: Optional[torch.dtype]):
    """``torch.autocast`` to ``dtype``; off where ``dtype`` is None."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def make_step(model: nn.Module, loss_of: Callable, predict: Callable, mode: str,
              dtype: Optional[torch.dtype], device: torch.device,
              optimizer: str = 'none') -> Callable[[], None]:
    """One training step of ``model`` (forward under autocast, loss, backward
    and, with ``optimizer='adamw'``, an AdamW step; else the gradients are
    dropped) or one inference call without gradients."""
    if mode == 'inference':
        model.eval()

        def infer() -> None:
            with torch.no_grad(), autocast(device, dtype):
                predict(model)
        return infer
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(params, **ADAMW) if optimizer == 'adamw' else None
    scaler = torch.amp.GradScaler(device.type) if adamw and dtype else None

    def train() -> None:
        with autocast(device, dtype):
            loss = loss_of(model)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(adamw)
            scaler.update()
        elif adamw:
            adamw.step()
        model.zero_grad(set_to_none=True)
    return train


def track_live_memory() -> None:
    """Makes this process's resident set follow its live allocations: glibc
    maps every block of 64 KiB or more on its own and unmaps it when freed
    (RuntimeError where the C library is not glibc)."""
    libc = ctypes.CDLL(ctypes.util.find_library('c'))
    if libc.mallopt(-3, 64 * 1024) != 1:  # M_MMAP_THRESHOLD
        raise RuntimeError('mallopt(M_MMAP_THRESHOLD) failed: live memory needs '
                           'glibc on Linux.')


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as status:
        return next(int(line.split()[1]) for line in status
                    if line.startswith(field + ':'))


def rss_growth_mib(call: Callable[[], None]) -> float:
    """The growth of the resident set's high-water mark during ``call()``."""
    with open('/proc/self/clear_refs', 'w') as clear_refs:
        clear_refs.write('5')  # resets VmHWM
    before = _status_kib('VmRSS')
    call()
    return (_status_kib('VmHWM') - before) / 1024


def time_steps(step: Callable[[], None], device: torch.device, steps: int) -> Dict:
    """``times_ms`` (CUDA events, or wall time), ``cpu_ms`` (this process's
    CPU time) and ``host_ms`` (the Python call alone) of ``steps`` steps."""
    times, cpu, host = [], [], []
    synchronize(device)
    for _ in range(steps):
        if device.type == 'cuda':
            events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            events[0].record()
        began, began_cpu = time.perf_counter(), time.process_time()
        step()
        host.append((time.perf_counter() - began) * 1e3)
        if device.type == 'cuda':
            events[1].record()
            events[1].synchronize()
            times.append(events[0].elapsed_time(events[1]))
        else:
            times.append(host[-1])
        cpu.append((time.process_time() - began_cpu) * 1e3)
    return dict(times_ms=times, cpu_ms=cpu, host_ms=host)


def union_length(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0., -math.inf
    for begin, finish in sorted(intervals):  # each adds what passes the last end
        total += max(0., finish - max(begin, end))
        end = max(end, finish)
    return total


def activity_kind(name: str, on_gpu: bool, kind: Optional[str] = None) -> Optional[str]:
    """``'kernel'``, ``'copy'``, ``'launch'`` (a host call launching GPU
    work) or None, from a profiler event's name, timeline and activity type."""
    if (kind or '').endswith('user_annotation'):
        return None
    if kind in ('kernel', 'gpu_memcpy', 'gpu_memset'):
        return 'kernel' if kind == 'kernel' else 'copy'
    if on_gpu and kind is None:
        return 'copy' if name.startswith(('Memcpy', 'Memset')) else 'kernel'
    return 'launch' if not on_gpu and LAUNCH_CALL.match(name) else None


def count_activity(step: Callable[[], None], device: torch.device, steps: int) -> Dict:
    """Per step under ``torch.profiler``: ``kernels``, ``copies``,
    ``launch_calls`` and ``busy_ms`` (the union of the kernels' and copies'
    intervals on the GPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    found = []
    for event in prof.profiler.kineto_results.events():
        kind = activity_kind(event.name(), event.device_type() != DeviceType.CPU,
                             getattr(event, 'activity_type', lambda: None)())
        if kind:
            start = event.start_ns()
            found.append((kind, start, start + event.duration_ns()))
    kinds = [kind for kind, _, _ in found]
    busy = union_length((a, b) for kind, a, b in found if kind != 'launch')
    return dict(kernels=kinds.count('kernel') / steps,
                copies=kinds.count('copy') / steps,
                launch_calls=kinds.count('launch') / steps or None,
                busy_ms=busy / steps / 1e6)


def host_sync_of(step: Callable[[], None], device: torch.device) -> Optional[str]:
    """On a GPU, one step under ``set_sync_debug_mode('error')``: ``'none'``,
    or the first host-device synchronisation's error."""
    if device.type != 'cuda':
        return None
    synchronize(device)
    torch.cuda.set_sync_debug_mode('error')
    try:
        step()
        return 'none'
    except RuntimeError as error:
        return describe(error)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def largest_batch(peaks: Dict[int, float], limit_mib: float) -> Dict:
    """The largest batch whose training peak ``fixed + batch * per_image``
    (the line through two measured peaks, by batch) stays within ``limit_mib``
    (ValueError with fewer than two batches, or peaks that do not grow)."""
    if len(peaks) < 2:
        raise ValueError(f'peaks={peaks} must hold two or more batch sizes.')
    low, high = min(peaks), max(peaks)
    per_image = (peaks[high] - peaks[low]) / (high - low)
    if per_image <= 0:
        raise ValueError(f'peaks={peaks} do not grow with the batch; measure again.')
    fixed = peaks[low] - low * per_image
    return dict(largest_batch=max(0, math.floor((limit_mib - fixed) / per_image)),
                per_image_mib=per_image, fixed_mib=fixed)


def largest_fitting_batch(fits: Callable[[int], bool], max_batch: int
                          ) -> Tuple[int, bool]:
    """The largest batch up to ``max_batch`` with ``fits(batch)``: doubling
    from 1, then bisecting; and whether ``max_batch`` stopped the search."""
    fitting, batch = 0, 1
    while fits(batch):
        fitting = batch
        if batch >= max_batch:
            return fitting, True
        batch = min(2 * batch, max_batch)
    low, high = fitting, batch
    while low and high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, False


def describe(error: BaseException) -> str:
    """``'TypeName: first line of the message'``, at most 300 characters."""
    lines = str(error).strip().splitlines()
    return (type(error).__name__ + (f': {lines[0]}' if lines else ''))[:300]


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


# --- One case
def build(case: Dict, device: torch.device, shapes) -> Tuple:
    """(module stepped, eager module, loss, predict) of a case."""
    import mmsoft
    if case['root'] and not mmsoft.__file__.startswith(case['root'] + '/'):
        raise RuntimeError(f'mmsoft was imported from {mmsoft.__file__}, not from '
                           f"root={case['root']}.")
    from .models import build_backbone, build_detector
    if case['detector']:
        model, loss, predict = build_detector(case['spec'], shapes, device)
        return model, model, loss, predict
    maps = build_backbone(case['spec']).to(device)
    images = images_of(shapes, case['pad'], device)
    maps.valid_shapes = [tuple(s) for s in shapes] if maps.takes_valid_shapes else None
    module = torch.compile(maps, backend=case['compile']) if case['compile'] else maps
    return module, maps, maps_loss(images), lambda m: m(images)


def measure_setting(case: Dict, built: Tuple, mode: str, precision: str,
                    device: torch.device) -> Dict:
    """The measured fields of one setting of a built case."""
    module, eager, loss, predict = built
    dtype = None if precision == 'float32' else getattr(torch, case['amp_dtype'])
    step = make_step(module, loss, predict, mode, dtype, device, case['optimizer'])
    fields = {}
    if case['compile']:
        began = time.perf_counter()
        step()  # compiles
        synchronize(device)
        fields['compile_s'] = time.perf_counter() - began
    if device.type == 'cpu' and (case['memory'] or case['live']):
        fields['live_peak_mib' if case['live'] else 'peak_mib'] = rss_growth_mib(step)
    if case['live']:
        return fields
    for _ in range(case['warmup']):
        step()
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fields['allocated_before_mib'] = torch.cuda.memory_allocated(device) / MIB
    fields.update(time_steps(step, device, case['steps']))
    if device.type == 'cuda':
        fields.update(max_allocated_mib=torch.cuda.max_memory_allocated(device) / MIB,
                      max_reserved_mib=torch.cuda.max_memory_reserved(device) / MIB)
    if case['kernels'] and device.type == 'cuda' and case['round'] == 0:
        fields.update(count_activity(step, device, case['kernels']))
    if case['host_sync'] and case['round'] == 0:
        fields['host_sync'] = host_sync_of(step, device)
    if case['regions']:
        from .op_profile import profile_tables
        fields.update(profile_tables(eager, step, device))
    if case['saved_tensors'] and mode == 'train':
        from .saved_tensors import SavedTensorRecorder
        with SavedTensorRecorder(eager) as recorder, autocast(device, dtype):
            loss(module)
        fields['saved_mib'] = {k: v / MIB
                               for k, v in recorder.bytes_by_prefix(1).items()}
    return fields


def capacity(case: Dict, built: Tuple, device: torch.device) -> Dict:
    """The largest training batch within ``memory_limit_gb``: on a GPU the
    largest that runs, on the CPU extrapolated from batches 1 and 2."""
    maps = built[1]
    size, limit_mib = tuple(case['shapes'][0]), case['memory_limit_gb'] * 1e9 / MIB
    maps.valid_shapes = None

    def step(batch: int) -> Callable[[], None]:
        images = images_of([size] * batch, case['pad'], device)
        return make_step(maps, maps_loss(images), None, 'train', None, device)

    if device.type == 'cpu':
        track_live_memory()
        peaks = {batch: rss_growth_mib(step(batch)) for batch in (1, 2)}
        return dict(largest_batch(peaks, limit_mib), peaks_mib=peaks)
    total = torch.cuda.get_device_properties(device).total_memory / MIB
    torch.cuda.set_per_process_memory_fraction(min(1., limit_mib / total), device)

    def fits(batch: int) -> bool:
        free(device)
        try:
            step(batch)()
            return True
        except torch.cuda.OutOfMemoryError:
            maps.zero_grad(set_to_none=True)
            return False
    found, reached = largest_fitting_batch(fits, case['max_batch'])
    return dict(largest_batch=found, limit_reached=reached)


def run_case(case: Dict, emit: Callable[[Dict], None]) -> None:
    """Builds the case's model and emits one record per setting (one for a
    capacity case); a failing setting is recorded and the next one runs."""
    from .runner import skipped
    device = torch.device(case['device'])
    if device.type == 'cpu':
        torch.set_num_threads(case['threads'])
    if case['live']:
        track_live_memory()
    shapes = [tuple(s) for s in case['shapes']]
    try:
        built = build(case, device, shapes)
    except Exception as error:  # a framework missing here, say
        for mode, precision in case['settings']:
            emit(skipped(case, mode, precision, 'error',
                         error=f'build failed: {describe(error)}'))
        return
    base = dict(params_m=sum(p.numel() for p in built[1].parameters()) / 1e6)
    if case['flops']:
        from .flop_handles import count_flops
        built[1].eval()
        with torch.no_grad():
            base['gflops'] = count_flops(built[1], (images_of(shapes, case['pad'],
                                                              device), ))[0] / 1e9
    for mode, precision in case['settings']:
        record = skipped(case, mode, precision, 'ok', **base)
        try:
            free(device)
            record.update(capacity(case, built, device) if case['capacity'] else
                          measure_setting(case, built, mode, precision, device))
        except Exception as error:  # an out-of-memory must not stop the rest
            built[1].zero_grad(set_to_none=True)
            record.update(status='error', error=describe(error))
        emit(record)


if __name__ == '__main__':
    CASE = json.loads(sys.argv[1])
    if CASE['root']:  # before the working directory, this checkout
        sys.path.insert(0, CASE['root'])
    run_case(CASE, lambda record: print('RESULT ' + json.dumps(record), flush=True))
