"""The GPU benchmark's measurements inside one worker process.

- :class:`InputSpec`: a batch as mmdet gives it to a backbone: images of
  their own sizes, zero-padded to one canvas whose sides are multiples of
  32, and each image's valid region.
- :func:`training_step`: forward, loss, backward and an AdamW step; under
  mixed precision float16 autocast and a ``torch.amp.GradScaler``, as
  mmengine's ``AmpOptimWrapper`` (``--amp``) runs it.
- :func:`time_steps`: the time of each step by CUDA events (wall time on
  the CPU), and the host's time to issue it.
- :func:`profile_activity`: the kernels, copies and launch calls of a few
  steps and the time the GPU is busy (the union of its activities'
  intervals), from ``torch.profiler``.
- :func:`memory_fields`: ``max_memory_allocated`` and
  ``max_memory_reserved`` of the timed steps.
- :func:`region_profile`: time, FLOPs, FLOP rate and kernels per region of
  the model (:mod:`mmsoft_analysis.op_profile`).
"""
import dataclasses
import re
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .measure import autocast_to

#: Side multiple of the padded canvas (mmdet's ``pad_size_divisor``).
PAD = 32
#: float32 (torch's defaults) and mixed precision (autocast and a loss scaler).
PRECISIONS = ('float32', 'amp')
#: Autocast dtypes of mixed precision: float16 as mmengine's ``--amp``;
#: bfloat16 for the CPU smoke mode (float16 is emulated on most CPUs).
AMP_DTYPES = ('float16', 'bfloat16')
#: AdamW as mmdet's Swin-T Mask R-CNN config sets it up.
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)
MODES = ('train', 'inference')
MIB = 2**20
#: Host calls that launch work on the GPU (runtime and driver API).
LAUNCH_CALL = re.compile(r'^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)')
#: Activity kinds of the GPU timeline, as kineto names them.
KERNEL, MEMCPY, MEMSET = 'kernel', 'gpu_memcpy', 'gpu_memset'
LAUNCH = 'launch'


def padded(side: int, multiple: int = PAD) -> int:
    """``side`` rounded up to a multiple of ``multiple``."""
    return -(-side // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A batch of images of ``shapes`` (H, W), padded to a common canvas.

    Args:
        name (str): The input's name in the tables (e.g. ``'coco-b2'``).
        shapes (tuple[tuple[int, int], ...]): Each image's valid region.
    """
    name: str
    shapes: Tuple[Tuple[int, int], ...]

    def __post_init__(self):
        if not self.shapes:
            raise ValueError(f'input {self.name!r} has no image; expected one or '
                             'more (H, W).')
        for shape in self.shapes:
            if len(shape) != 2 or any(not isinstance(s, int) or s < 1 for s in shape):
                raise ValueError(f'input {self.name!r}: shape {shape!r} is invalid; '
                                 'expected (H, W), positive integers.')

    @property
    def batch(self) -> int:
        return len(self.shapes)

    @property
    def canvas(self) -> Tuple[int, int]:
        """(H, W) of the padded batch: each side's largest, rounded up to 32."""
        return (padded(max(h for h, _ in self.shapes)),
                padded(max(w for _, w in self.shapes)))

    def describe(self) -> str:
        """E.g. ``'batch 2: 800x1199, 800x1067 on 800x1216'``."""
        sizes = ', '.join(f'{h}x{w}' for h, w in self.shapes)
        height, width = self.canvas
        return f'batch {self.batch}: {sizes} on {height}x{width}'

    def images(self, device: torch.device, seed: int = 0) -> torch.Tensor:
        """(B, 3, H, W) normalised random images, zero outside each valid
        region (mmdet pads after normalising)."""
        generator = torch.Generator().manual_seed(seed)
        images = torch.zeros(self.batch, 3, *self.canvas)
        for index, (height, width) in enumerate(self.shapes):
            images[index, :, :height, :width] = torch.randn(3, height, width,
                                                            generator=generator)
        return images.to(device)


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast_dtype(precision: str, amp_dtype: str = 'float16') -> Optional[torch.dtype]:
    """The autocast dtype of ``precision``: None for float32, ``amp_dtype``
    (one of :data:`AMP_DTYPES`) for ``'amp'``."""
    if precision not in PRECISIONS:
        raise ValueError(f'precision={precision!r} is not supported; expected one '
                         f'of {list(PRECISIONS)}.')
    if amp_dtype not in AMP_DTYPES:
        raise ValueError(f'amp_dtype={amp_dtype!r} is not supported; expected one '
                         f'of {list(AMP_DTYPES)}.')
    return None if precision == 'float32' else getattr(torch, amp_dtype)


def training_step(model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor],
                  dtype: Optional[torch.dtype], device: torch.device
                  ) -> Tuple[Callable[[], None], Callable[[], None]]:
    """A training step of ``model``: ``loss_of(model)`` under autocast to
    ``dtype`` (None: none), its backward and an AdamW step (:data:`ADAMW`);
    under autocast the loss is scaled by a ``torch.amp.GradScaler``. The
    model is put in train mode.

    Returns:
        tuple: ``step()`` and ``close()``, which drops the gradients and the
        optimizer's state.
    """
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  **ADAMW)
    scaler = None if dtype is None else torch.amp.GradScaler(device.type)

    def step() -> None:
        with autocast_to(device, dtype):
            loss = loss_of(model)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def close() -> None:
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()

    return step, close


def inference_step(model: nn.Module, predict: Callable[[nn.Module], object],
                   dtype: Optional[torch.dtype], device: torch.device
                   ) -> Tuple[Callable[[], None], Callable[[], None]]:
    """``predict(model)`` without gradients, under autocast to ``dtype``
    (None: none); the model is put in eval mode. Returns ``step()`` and
    ``close()``."""
    model.eval()

    def step() -> None:
        with torch.no_grad(), autocast_to(device, dtype):
            predict(model)

    return step, lambda: None


def maps_loss(images: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    """The backbones' training loss: the sum of the maps' means (float32)."""
    return lambda model: sum(feature.float().mean() for feature in model(images))


def time_steps(step: Callable[[], None], device: torch.device, warmup: int,
               steps: int) -> Dict:
    """Times ``steps`` calls of ``step`` after ``warmup`` untimed ones.

    On CUDA each step lies between two CUDA events and is synchronised
    before the next (as a training loop that logs its loss is); on the CPU
    its wall time is taken.

    Returns:
        dict: ``times_ms`` (each step), ``host_ms`` (the host's time to run
        the Python call, before waiting for the GPU) and ``timer``.
    """
    for _ in range(warmup):
        step()
    synchronize(device)
    cuda = device.type == 'cuda'
    times, host = [], []
    for _ in range(steps):
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        step()
        host.append((time.perf_counter() - began) * 1e3)
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            times.append(host[-1])
    return dict(times_ms=times, host_ms=host,
                timer='cuda-event' if cuda else 'perf_counter')


def reset_memory(device: torch.device) -> Optional[float]:
    """Resets the allocator's peaks (CUDA); returns the MiB allocated then
    (weights and, after a training step, the optimizer's state), None on
    the CPU."""
    if device.type != 'cuda':
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / MIB


def memory_fields(device: torch.device) -> Dict:
    """``max_memory_allocated_mib`` and ``max_memory_reserved_mib`` since
    the last :func:`reset_memory` (None on the CPU)."""
    if device.type != 'cuda':
        return dict(max_memory_allocated_mib=None, max_memory_reserved_mib=None)
    synchronize(device)
    return dict(max_memory_allocated_mib=torch.cuda.max_memory_allocated(device) / MIB,
                max_memory_reserved_mib=torch.cuda.max_memory_reserved(device) / MIB)


# --- Kernels, launches and busy time
def _value(event, attribute: str):
    """An event's field: a method of kineto's events, an attribute of
    ``FunctionEvent``; None when it has neither."""
    value = getattr(event, attribute, None)
    return value() if callable(value) else value


def activity_kind(name: str, on_gpu: bool, activity_type: Optional[str] = None,
                  annotation: bool = False) -> Optional[str]:
    """What a profiler event is: :data:`KERNEL`, :data:`MEMCPY`,
    :data:`MEMSET`, :data:`LAUNCH` (a host call that launches GPU work), or
    None (anything else: operators, annotations, other runtime calls).

    Args:
        name (str): The event's name.
        on_gpu (bool): Whether it lies on the GPU's timeline.
        activity_type (str, optional): Kineto's kind (``'kernel'``,
            ``'gpu_memcpy'``, ``'gpu_memset'``, ``'gpu_user_annotation'``,
            ``'cuda_runtime'``, ...), where the torch build reports it.
        annotation (bool): Whether it is a user annotation (a
            ``record_function`` range, on either timeline).
    """
    if annotation or (activity_type or '').endswith('user_annotation'):
        return None
    if activity_type in (KERNEL, MEMCPY, MEMSET):
        return activity_type
    if on_gpu:
        if activity_type is not None:
            return None
        if name.startswith('Memcpy'):
            return MEMCPY
        if name.startswith('Memset'):
            return MEMSET
        return KERNEL
    return LAUNCH if LAUNCH_CALL.match(name) else None


def profiler_activities(prof) -> List[Tuple[str, int, int]]:
    """(kind, start ns, end ns) of each kernel, copy, memset and launch call
    of a finished ``torch.profiler.profile`` (see :func:`activity_kind`)."""
    from torch.autograd import DeviceType
    results = getattr(prof.profiler, 'kineto_results', None)
    found = []
    if results is not None:
        for event in results.events():
            kind = activity_kind(_value(event, 'name'),
                                 _value(event, 'device_type') != DeviceType.CPU,
                                 _value(event, 'activity_type'),
                                 bool(_value(event, 'is_user_annotation')))
            if kind is not None:
                start = _value(event, 'start_ns')
                found.append((kind, start, start + _value(event, 'duration_ns')))
        return found
    for event in prof.events():  # FunctionEvents, times in microseconds
        kind = activity_kind(event.name, event.device_type != DeviceType.CPU,
                             _value(event, 'activity_type'),
                             bool(_value(event, 'is_user_annotation')))
        if kind is not None:
            found.append((kind, int(event.time_range.start * 1e3),
                          int(event.time_range.end * 1e3)))
    return found


def union_length(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, current_start, current_end = 0., None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def activity_counts(activities: Sequence[Tuple[str, int, int]], steps: int) -> Dict:
    """Per step: ``kernels``, ``copies`` (memcpy and memset), ``launch_calls``
    (host calls launching GPU work; None where the profile recorded none, as
    a build without runtime tracing) and ``busy_ms`` (the union of the
    kernels', copies' and memsets' intervals)."""
    kinds = [kind for kind, _, _ in activities]
    on_gpu = [(start, end) for kind, start, end in activities if kind != LAUNCH]
    launches = kinds.count(LAUNCH)
    return dict(kernels=kinds.count(KERNEL) / steps,
                copies=(kinds.count(MEMCPY) + kinds.count(MEMSET)) / steps,
                launch_calls=launches / steps if launches else None,
                busy_ms=union_length(on_gpu) / steps / 1e6)


def profile_activity(step: Callable[[], None], device: torch.device,
                     steps: int) -> Dict:
    """:func:`activity_counts` of ``steps`` calls of ``step`` under
    ``torch.profiler`` (CUDA activity only), and ``profiled_ms``: their wall
    time per step, profiler overhead included."""
    from torch.profiler import ProfilerActivity, profile
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        began = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        profiled = (time.perf_counter() - began) * 1e3 / steps
    return dict(activity_counts(profiler_activities(prof), steps),
                profiled_steps=steps, profiled_ms=profiled)


def region_profile(model: nn.Module, step: Callable[[], None],
                   device: torch.device) -> Dict:
    """One step under ``torch.profiler`` with the model's regions named
    (:func:`~mmsoft_analysis.op_profile.profile_regions`): per region the
    time of its operators (kernel time on a GPU, CPU time on the CPU) with
    their backward, FLOPs, FLOP rate and kernels.

    Returns:
        dict: ``regions``: region -> {``ms``, ``gflop``, ``tflop_per_s``
        (None where no time was spent), ``kernels``}, in
        :data:`~mmsoft_analysis.op_profile.REGION_ORDER`; ``profiled_ms``.
    """
    from torch.profiler import ProfilerActivity, profile

    from .op_profile import REGION_ORDER, attribute, profile_regions
    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile_regions(model):
        with profile(activities=activities, record_shapes=True) as prof:
            began = time.perf_counter()
            step()
            synchronize(device)
            profiled = (time.perf_counter() - began) * 1e3
    tables = attribute(prof.events(), device.type)
    names = [name for name in REGION_ORDER if name in tables['regions']]
    names += sorted(set(tables['regions']) - set(names))
    regions = {}
    for name in names:
        entry = tables['regions'][name]
        regions[name] = dict(
            ms=entry['us'] / 1e3, gflop=entry['flops'] / 1e9,
            tflop_per_s=entry['flops'] / entry['us'] / 1e6 if entry['us'] else None,
            kernels=entry['kernels'])
    return dict(regions=regions, profiled_ms=profiled)
