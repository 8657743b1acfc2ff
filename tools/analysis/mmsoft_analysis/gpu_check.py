"""A GPU check in one run: the CUDA tests, then a short timed benchmark.

Needs torch, and timm for the peers (pytest for the tests); no OpenMMLab
package. :func:`run_check` runs ``pytest tests/test_cuda.py`` in a child
process, then measures the backbones of :mod:`mmsoft_analysis.gpu_backbones`
case by case, each case (one model at one size and dtype, its training step
and its inference forward) in its own child process, killed at its hard
limit or when the budget runs out. The cases come in phases, the figures
users ask for first, so that a spent budget cuts the least important ones:

1. ``core``: every backbone at the first size (800x1333) in float32 and
   under bfloat16 autocast;
2. ``large``: the same at the other sizes (1536x1536);
3. ``solvers``: SOFT++'s other solvers, as they run on the device
   (:func:`~mmsoft.models.soft.solver_that_runs`: on a GPU
   ``'newton_closed_form'``, the configs' solver, runs the Newton iteration,
   so there it is measured once, with ``'exact'`` beside it);
4. ``compiled``: ``torch.compile`` (inductor on CUDA) of SOFT++-tiny (the
   Newton iteration, :data:`COMPILED_SOLVER`) and UFO-ViT-small beside
   eager, float32 at the first size;
5. ``float16``: every backbone at every size under float16 autocast;
6. ``capacity``: the largest training batch at 1024x1024 within a memory
   cap (``torch.cuda.set_per_process_memory_fraction``) of UFO-ViT-small,
   SOFT++-small and Swin-T.

A training step is the forward of batch 2 (under autocast for the reduced
dtypes) and the backward of the sum of its maps' means, the gradients
dropped; inference is the forward without gradients. mmsoft's backbones get
valid regions (the second image three quarters of the canvas on each side,
as a padded batch); the peers see the whole canvas. Each measurement reports
the median time of a few calls after warm-up (``time_ms``, CUDA
synchronised), ``images_per_s``, and on CUDA ``torch.cuda.max_memory_allocated``
of one more call (``max_memory_mib``, weights and input included). The first
case of each model also runs one training step and one inference under
``torch.cuda.set_sync_debug_mode('error')`` (``host_sync``). On the CPU (the
smoke mode) the memory and sync fields are None and the capacity search runs
up to its batch limit without a cap.

The results file (JSON) and its Markdown table are rewritten after every
record: a run cut short keeps what it measured.
"""
import dataclasses
import gc
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmsoft.models.soft import SOLVERS, solver_that_runs
from mmsoft.utils import check_choice, check_positive_int
from .sizes import parse_size  # noqa: F401 (the tool's --sizes)

from . import REPO, worker_command, worker_env
from .gpu_backbones import (BACKBONES, DEFAULT_BACKBONES, build_maps, is_mmsoft,
                            is_soft, source_of, unavailable_reason)
from .measure import peak_memory_of, run_once, seconds_of, timing_fields

CUDA_TESTS = (str(REPO / 'tests' / 'test_cuda.py'), )
# The shipped configs' solver first.
DEFAULT_SOLVERS = ('newton_closed_form', ) + tuple(s for s in SOLVERS
                                                   if s != 'newton_closed_form')
#: Autocast dtype per dtype name; None runs in float32 without autocast.
AUTOCAST_DTYPES = {'float32': None, 'bfloat16': torch.bfloat16,
                   'float16': torch.float16}
DTYPES = ('float32', 'bfloat16', 'float16')
#: Measured in its own late phase (``float16``).
LATE_DTYPE = 'float16'
MODES = ('train', 'inference')
SIZES = ((800, 1333), (1536, 1536))
PHASES = ('core', 'large', 'solvers', 'compiled', 'float16', 'capacity')
#: One SOFT++ and one UFO-ViT model, compiled beside eager.
COMPILED_BACKBONES = ('soft++-tiny', 'ufo-vit-small')
#: The solver of the compiled SOFT++ model: the Newton iteration, which the
#: configs' ``'newton_closed_form'`` runs on a GPU, on every device (the
#: closed form's eigendecomposition, its CPU path, breaks dynamo's graph).
COMPILED_SOLVER = 'newton'
CAPACITY_BACKBONES = ('ufo-vit-small', 'soft++-small', 'swin-t')
#: The capacity's reference: the other backbones' batches relative to its.
CAPACITY_REFERENCE = 'swin-t'
CAPACITY_SIZE = (1024, 1024)
CAPACITY_CAP_GIB = 16.
CAPACITY_DTYPE = 'float32'
#: Batch limit of the capacity search, on CUDA and on the CPU (smoke mode).
CAPACITY_MAX_BATCH = {'cuda': 512, 'cpu': 2}
#: torch.compile's backend per device type: the CPU smoke mode traces the
#: model with dynamo and runs the graphs eagerly (inductor's C++ compile
#: takes minutes there).
COMPILE_BACKENDS = {'cuda': 'inductor', 'cpu': 'eager'}
DEFAULT_BUDGET_S = 360.
DEFAULT_TESTS_TIMEOUT_S = 120.
DEFAULT_CASE_TIMEOUT_S = 150.
DEFAULT_COMPILE_TIMEOUT_S = 300.
#: Seconds of a total budget kept for writing the results at the end.
FINISH_MARGIN_S = 5.
DEFAULT_OUT = 'work_dirs/gpu_check/gpu_check.json'
#: Threads of each case's process on the CPU: on a machine shared with other
#: work, one thread per process avoids OpenMP's waits for busy cores.
CPU_THREADS = 1
CPU_SMOKE_COMMAND = ('python tools/analysis/gpu_check.py --device cpu '
                     '--sizes 64x64 --repeats 1 --skip-tests')
PACKAGES = ('torch', 'numpy', 'timm', 'pytest', 'mmsoft', 'mmengine', 'mmdet')
MIB = 2**20
GIB = 2**30
#: Images per measured call, the second with a smaller valid region.
BATCH = 2
OUTPUT_TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class Case:
    """One child process: a model (backbone, solver, compiled or not) at one
    size and dtype, measured in each of ``modes``; or, in the ``capacity``
    phase, its largest training batch."""
    phase: str
    backbone: str
    solver: Optional[str]
    dtype: str
    size: Tuple[int, int]
    modes: Tuple[str, ...]
    compiled: bool = False
    sync_debug: bool = False

    @property
    def name(self) -> str:
        """E.g. ``'soft++-tiny/newton+compiled'``."""
        return (self.backbone + (f'/{self.solver}' if self.solver else '') +
                ('+compiled' if self.compiled else ''))

    def label(self, mode: Optional[str] = None) -> str:
        """E.g. ``'soft++-tiny/newton bfloat16 800x1333 train'``."""
        mode = mode or ' '.join(self.modes)
        return f'{self.name} {self.dtype} {self.size[0]}x{self.size[1]} {mode}'

    def record(self, mode: str, status: str, **fields) -> Dict:
        """A result record of ``mode`` with ``status`` and measured ``fields``.

        Args:
            mode (str): ``'train'`` or ``'inference'`` (``'capacity'`` in
                that phase).
            status (str): ``'ok'``, ``'error'`` or ``'skipped'``.
            **fields: Values replacing the record's None defaults.

        Returns:
            dict: ``phase``, ``backbone``, ``source``, ``solver``,
            ``solver_runs``, ``compiled``, ``dtype``, ``height``, ``width``,
            ``mode``, ``batch``, ``valid_regions``, ``status``, the measured
            fields (None until measured: ``time_ms``, ``all_time_ms``,
            ``images_per_s``, ``max_memory_mib``, ``memory_above_start_mib``,
            ``host_sync``, ``params_m``, ``compile_backend``, ``compile_s``),
            ``error`` and ``note``.
        """
        record = dict(phase=self.phase, backbone=self.backbone,
                      source=source_of(self.backbone), solver=self.solver,
                      solver_runs=None, compiled=self.compiled, dtype=self.dtype,
                      height=self.size[0], width=self.size[1], mode=mode,
                      batch=BATCH, valid_regions=is_mmsoft(self.backbone),
                      status=status, time_ms=None, all_time_ms=None,
                      images_per_s=None, max_memory_mib=None,
                      memory_above_start_mib=None, host_sync=None, params_m=None,
                      compile_backend=None, compile_s=None, error=None, note=None)
        record.update(fields)
        return record

    def capacity_record(self, status: str, **fields) -> Dict:
        """A record of the capacity phase: ``largest_batch``, ``cap_mib``,
        ``cap_enforced``, ``limit_reached``, ``max_batch`` and ``probes``
        (batch, fits, max_memory_mib, time_ms of each step tried) beside the
        fields of :meth:`record`."""
        record = self.record('capacity', status)
        record.update(batch=None, valid_regions=False, largest_batch=None,
                      cap_mib=None, cap_enforced=None, limit_reached=None,
                      max_batch=None, probes=[])
        record.update(fields)
        return record


@dataclasses.dataclass
class CheckSettings:
    """What :func:`run_check` runs.

    Args:
        out (str): The results file (JSON). Default: :data:`DEFAULT_OUT`.
        markdown (str, optional): The Markdown table. Default: None (``out``
            with ``.md`` in place of ``.json``).
        device (str): ``'cuda'`` (or ``'cuda:N'``), or ``'cpu'`` for a smoke
            run. Default: ``'cuda'``.
        backbones (Sequence[str]): Names among
            :data:`~mmsoft_analysis.gpu_backbones.BACKBONES`.
        solvers (Sequence[str]): SOFT++ solvers, the first in every phase,
            the others in ``solvers``. Default: :data:`DEFAULT_SOLVERS`.
        dtypes (Sequence[str]): Names among :data:`AUTOCAST_DTYPES`; the
            first is the dtype of the solvers, compiled and capacity phases.
        sizes (Sequence[tuple[int, int]]): Input sizes (H, W), the first in
            ``core``, the others in ``large``.
        modes (Sequence[str]): Among :data:`MODES`.
        phases (Sequence[str]): Among :data:`PHASES`.
        budget_s (float): Seconds of benchmark after which the remaining
            cases are skipped. Default: :data:`DEFAULT_BUDGET_S`.
        total_budget_s (float, optional): Seconds for the whole check, tests
            included: the benchmark gets what the tests leave of it (less
            :data:`FINISH_MARGIN_S`), at most ``budget_s``; the tests at most
            all of it. Default: None (``budget_s`` alone).
        warmup (int): Untimed calls before timing. Default: 1.
        repeats (int): Timed calls (the median is reported). Default: 3.
        run_tests (bool): Run the CUDA tests first. Default: True.
        tests (Sequence[str]): The pytest paths. Default: :data:`CUDA_TESTS`.
        tests_timeout_s (float): Limit of the test run.
        case_timeout_s (float): Hard limit of each case's process.
        compile_timeout_s (float): Hard limit of a compiled case's process.
        compile_backend (str, optional): ``torch.compile``'s backend.
            Default: None (:data:`COMPILE_BACKENDS` of the device type).
        capacity_size (tuple[int, int], optional): Input of the capacity
            search. Default: None (:data:`CAPACITY_SIZE` on CUDA, the first
            size on the CPU).
        capacity_cap_gib (float): Memory cap of the capacity search (CUDA).
        capacity_max_batch (int, optional): Largest batch tried. Default:
            None (:data:`CAPACITY_MAX_BATCH` of the device type).
        cpu_threads (int): torch's threads in each case's process on the
            CPU. Default: :data:`CPU_THREADS`.
    """
    out: str = DEFAULT_OUT
    markdown: Optional[str] = None
    device: str = 'cuda'
    backbones: Sequence[str] = DEFAULT_BACKBONES
    solvers: Sequence[str] = DEFAULT_SOLVERS
    dtypes: Sequence[str] = DTYPES
    sizes: Sequence[Tuple[int, int]] = SIZES
    modes: Sequence[str] = MODES
    phases: Sequence[str] = PHASES
    budget_s: float = DEFAULT_BUDGET_S
    total_budget_s: Optional[float] = None
    warmup: int = 1
    repeats: int = 3
    run_tests: bool = True
    tests: Sequence[str] = CUDA_TESTS
    tests_timeout_s: float = DEFAULT_TESTS_TIMEOUT_S
    case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S
    compile_backend: Optional[str] = None
    capacity_size: Optional[Tuple[int, int]] = None
    capacity_cap_gib: float = CAPACITY_CAP_GIB
    capacity_max_batch: Optional[int] = None
    cpu_threads: int = CPU_THREADS

    def __post_init__(self):
        check_positive_int('repeats', self.repeats)
        check_positive_int('cpu_threads', self.cpu_threads)
        for name in ('warmup', 'budget_s', 'tests_timeout_s', 'case_timeout_s',
                     'compile_timeout_s', 'capacity_cap_gib'):
            _check_non_negative(name, getattr(self, name))
        if self.total_budget_s is not None:
            _check_non_negative('total_budget_s', self.total_budget_s)
        check_lists((('backbone', self.backbones, BACKBONES),
                     ('solver', self.solvers, SOLVERS),
                     ('dtype', self.dtypes, AUTOCAST_DTYPES),
                     ('mode', self.modes, MODES),
                     ('phase', self.phases, PHASES)))
        if not self.sizes:
            raise ValueError('no size given.')
        device_type = fill_output_defaults(self)
        if self.capacity_size is None:
            self.capacity_size = (CAPACITY_SIZE if device_type == 'cuda'
                                  else tuple(self.sizes[0]))
        if self.capacity_max_batch is None:
            self.capacity_max_batch = CAPACITY_MAX_BATCH.get(device_type, 2)
        check_positive_int('capacity_max_batch', self.capacity_max_batch)


def check_lists(lists: Sequence[Tuple[str, Sequence, Sequence]],
                may_be_empty: Sequence[str] = ()) -> None:
    """Checks ``(name, values, choices)`` lists: each value one of its
    choices, and a list not empty unless its name is in ``may_be_empty``.

    Raises:
        ValueError: Naming the list, the value and the choices.
    """
    for name, values, choices in lists:
        if not values and name not in may_be_empty:
            raise ValueError(f'no {name} given; expected one or more of '
                             f'{tuple(choices)}.')
        for value in values:
            check_choice(name, value, choices)


def fill_output_defaults(settings) -> str:
    """Sets a tool's settings' ``markdown`` (``out`` with ``.md``) and
    ``compile_backend`` (:data:`COMPILE_BACKENDS` of the device type) where
    they are None; returns the device type."""
    device_type = torch.device(settings.device).type
    if settings.markdown is None:
        settings.markdown = os.path.splitext(settings.out)[0] + '.md'
    if settings.compile_backend is None:
        settings.compile_backend = COMPILE_BACKENDS.get(device_type, 'inductor')
    return device_type


def _check_non_negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f'{name}={value!r} is invalid; expected a number >= 0.')


def require_device(device: str, tool: str = 'the GPU check',
                   smoke: str = 'only the benchmark part, on CPU at a tiny size, '
                   f'as a smoke test: {CPU_SMOKE_COMMAND}') -> torch.device:
    """The device to measure on, refusing CUDA where there is none.

    Args:
        device (str): ``'cuda'``, ``'cuda:N'`` or ``'cpu'``.
        tool (str): What refuses, for the message. Default: the GPU check.
        smoke (str): What to run instead, for the message. Default: the GPU
            check's CPU smoke mode.

    Raises:
        ValueError: When ``device`` is neither CPU nor CUDA.
        RuntimeError: When a CUDA device is asked for and none is available;
            the message says how to run the CPU smoke mode instead.
    """
    parsed = torch.device(device)
    check_choice('device type', parsed.type, ('cuda', 'cpu'))
    if parsed.type == 'cuda' and not torch.cuda.is_available():
        raise RuntimeError(
            f'device={device!r} needs a CUDA device, but torch.cuda.is_available() '
            f'is False here (torch {torch.__version__}, built for CUDA '
            f'{torch.version.cuda}). Run {tool} on a machine with a CUDA '
            f'GPU and a CUDA build of torch, or run {smoke}')
    return parsed


def phase_backbones(phase: str, names: Sequence[str],
                    chosen: Sequence[str]) -> List[str]:
    """The backbones of a phase's list ``names`` that ``chosen`` holds, in
    the order of ``names``.

    Raises:
        ValueError: When ``names`` holds a backbone that is not one of
            :data:`~mmsoft_analysis.gpu_backbones.BACKBONES` (the phase
            would never measure it).
    """
    unknown = [name for name in names if name not in BACKBONES]
    if unknown:
        raise ValueError(f'the {phase!r} phase names backbones {unknown} that '
                         f'are not known; expected names among {list(BACKBONES)}.')
    return [name for name in names if name in chosen]


def make_cases(settings: CheckSettings, device_type: str = 'cuda') -> List[Case]:
    """Every case of ``settings``, in the order they are measured (the
    phases of :data:`PHASES` that ``settings.phases`` names).

    The SOFT++ solvers count by the path that runs on ``device_type``: a
    solver that runs as an earlier one (on a GPU ``'newton_closed_form'``
    runs as ``'newton'``) is measured once. The first case of each model
    runs under the sync debug mode.
    """
    dtypes = list(settings.dtypes)
    first_dtype, first_size = dtypes[0], tuple(settings.sizes[0])
    early_dtypes = [d for d in dtypes if d != LATE_DTYPE] or [first_dtype]
    runs = {}
    for solver in settings.solvers:
        runs.setdefault(solver_that_runs(solver, device_type), solver)
    main_solver, *other_solvers = list(runs.values())
    backbones = list(dict.fromkeys(settings.backbones))
    modes = tuple(settings.modes)

    def solver_of(backbone: str, solver: Optional[str] = None) -> Optional[str]:
        return (solver or main_solver) if is_soft(backbone) else None

    def sweep(phase: str, sizes, phase_dtypes) -> List[Case]:
        return [Case(phase, b, solver_of(b), d, tuple(size), modes)
                for size in sizes for d in phase_dtypes for b in backbones]

    phases = {
        'core': lambda: sweep('core', [first_size], early_dtypes),
        'large': lambda: sweep('large', settings.sizes[1:], early_dtypes),
        'solvers': lambda: [Case('solvers', b, s, first_dtype, first_size, modes)
                            for b in backbones if is_soft(b) for s in other_solvers],
        'compiled': lambda: [Case('compiled', b, solver_of(b, COMPILED_SOLVER),
                                  first_dtype, first_size, modes, compiled=True)
                             for b in phase_backbones('compiled', COMPILED_BACKBONES,
                                                      backbones)],
        'float16': lambda: (sweep('float16', settings.sizes, [LATE_DTYPE])
                            if LATE_DTYPE in dtypes and len(dtypes) > 1 else []),
        'capacity': lambda: [Case('capacity', b, solver_of(b), CAPACITY_DTYPE,
                                  tuple(settings.capacity_size), ('train', ))
                             for b in phase_backbones(
                                 'capacity', CAPACITY_BACKBONES, backbones)],
    }
    cases, seen_models = [], set()
    for phase in PHASES:
        if phase not in settings.phases:
            continue
        for case in phases[phase]():
            model = (case.backbone, case.solver)
            if not case.compiled and phase != 'capacity' and model not in seen_models:
                seen_models.add(model)
                case = dataclasses.replace(case, sync_debug=True)
            cases.append(case)
    return cases


def valid_regions(size: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The batch's valid regions: the whole canvas, then three quarters of
    each side (a padded second image)."""
    height, width = size
    return [(height, width), (max(1, 3 * height // 4), max(1, 3 * width // 4))]


def describe_error(error: BaseException) -> str:
    """``'TypeName: first line of the message'``, at most 300 characters."""
    lines = str(error).strip().splitlines()
    text = type(error).__name__ + (f': {lines[0]}' if lines else '')
    return text[:300]


def free_memory(device: torch.device) -> None:
    """Drops unreachable tensors and, on CUDA, the allocator's cached blocks."""
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def host_sync_of(call: Callable[[], object], device: torch.device) -> Optional[str]:
    """On CUDA, runs ``call()`` once under
    ``torch.cuda.set_sync_debug_mode('error')``: ``'none'``, or the error
    of its first host-device synchronisation. None on other devices."""
    if device.type != 'cuda':
        return None
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode('error')
    try:
        call()
        return 'none'
    except RuntimeError as error:
        return describe_error(error)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def memory_fields(call: Callable[[], object], device: torch.device) -> Dict:
    """``max_memory_mib`` and ``memory_above_start_mib`` of one ``call()``
    (None on CPU)."""
    if device.type != 'cuda':
        return dict(max_memory_mib=None, memory_above_start_mib=None)
    above_start = peak_memory_of(call, device)  # resets the peak first
    return dict(max_memory_mib=torch.cuda.max_memory_allocated(device) / MIB,
                memory_above_start_mib=above_start / MIB)


def dtype_problem(dtype: str, device: torch.device) -> Optional[str]:
    """Why ``dtype`` cannot be measured on ``device``, or None."""
    if (dtype == 'bfloat16' and device.type == 'cuda'
            and not torch.cuda.is_bf16_supported()):
        return 'this GPU has no bfloat16'
    return None


def measure_mode(model: nn.Module, case: Case, mode: str, device: torch.device,
                 warmup: int, repeats: int) -> Dict:
    """Time, memory and host syncs of ``case`` in ``mode`` on the built
    ``model`` (a :class:`~mmsoft_analysis.gpu_backbones.BackboneMaps`, or its
    compiled form).

    Returns:
        dict: The measured fields of :meth:`Case.record`.
    """
    torch.manual_seed(0)
    images = torch.randn(BATCH, 3, *case.size, device=device)  # (2, 3, H, W)
    training = mode == 'train'
    model.train(training)
    dtype = AUTOCAST_DTYPES[case.dtype]
    call = lambda: run_once(model, images, training, dtype)  # noqa: E731
    fields = {}
    if case.compiled:
        fields['compile_s'] = seconds_of(call, device)  # compiles
    timing = timing_fields(call, device, warmup, repeats)
    fields.update(time_ms=timing['seconds'] * 1e3,
                  all_time_ms=[s * 1e3 for s in timing['all_seconds']],
                  images_per_s=BATCH / timing['seconds'])
    if case.sync_debug:
        fields['host_sync'] = host_sync_of(call, device)
    fields.update(memory_fields(call, device))
    return fields


def _synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def prepared_model(case: Case, device: torch.device,
                   compile_backend: str) -> Tuple[nn.Module, nn.Module]:
    """The case's model on ``device`` with the batch's valid regions set:
    the module measured (compiled for a compiled case) and the eager one."""
    maps = build_maps(case.backbone, case.solver).to(device)
    maps.valid_shapes = valid_regions(case.size) if maps.takes_valid_shapes else None
    if case.compiled:
        return torch.compile(maps, backend=compile_backend), maps
    return maps, maps


def run_case(case: Case, device: torch.device, warmup: int, repeats: int,
             compile_backend: str,
             emit: Callable[[Dict], None] = lambda record: None) -> List[Dict]:
    """Builds and measures ``case`` in this process, one record per mode.

    Each record is passed to ``emit`` as soon as it is made; a failure in one
    mode (an out-of-memory error, say) is recorded and the next mode runs.
    """
    records = []

    def add(record: Dict) -> None:
        records.append(record)
        emit(record)

    problem = dtype_problem(case.dtype, device)
    if problem:
        for mode in case.modes:
            add(case.record(mode, 'skipped', note=problem))
        return records
    solver_runs = solver_that_runs(case.solver, device.type) if case.solver else None
    common = dict(solver_runs=solver_runs,
                  compile_backend=compile_backend if case.compiled else None)
    try:
        model, eager = prepared_model(case, device, compile_backend)
    except Exception as error:
        for mode in case.modes:
            add(case.record(mode, 'error', error=f'build failed: '
                            f'{describe_error(error)}', **common))
        return records
    params_m = sum(p.numel() for p in eager.parameters()) / 1e6
    for mode in case.modes:
        try:
            fields = measure_mode(model, case, mode, device, warmup, repeats)
            add(case.record(mode, 'ok', params_m=params_m, **common, **fields))
        except Exception as error:  # an OOM or a failure must not stop the rest
            eager.zero_grad(set_to_none=True)
            add(case.record(mode, 'error', params_m=params_m, **common,
                            error=describe_error(error)))
        finally:
            free_memory(device)
    return records


def largest_fitting_batch(fits: Callable[[int], bool], max_batch: int
                          ) -> Tuple[int, bool]:
    """The largest batch ``b <= max_batch`` with ``fits(b)``, assuming that
    what fits is every batch up to some size: doubling from 1, then
    bisecting between the last batch that fitted and the first that did not.

    Returns:
        tuple[int, bool]: The batch (0 when 1 does not fit) and whether the
        search stopped at ``max_batch`` rather than at a batch that did not
        fit.
    """
    fitting, batch = 0, 1
    while fits(batch):
        fitting = batch
        if batch >= max_batch:
            return fitting, True
        batch = min(2 * batch, max_batch)
    low, high = fitting, batch  # fits(low) (or low is 0), not fits(high)
    while low and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, False


def _is_out_of_memory(error: BaseException) -> bool:
    out_of_memory = getattr(torch.cuda, 'OutOfMemoryError', ())
    return isinstance(error, out_of_memory) or 'out of memory' in str(error)


def run_capacity(case: Case, device: torch.device, cap_gib: float,
                 max_batch: int) -> Dict:
    """The largest training batch of ``case`` at its size within ``cap_gib``.

    On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction`` of the
    device's memory (the whole device when the cap exceeds it): a step that
    needs more raises out-of-memory and does not fit. On the CPU no cap is
    enforced: the search runs the same steps up to ``max_batch``.

    Returns:
        dict: The case's :meth:`Case.capacity_record`.
    """
    solver_runs = solver_that_runs(case.solver, device.type) if case.solver else None
    cap_bytes = int(cap_gib * GIB)
    enforced, note = device.type == 'cuda', None
    if enforced:
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1., cap_bytes / total)
        if fraction == 1.:
            note = (f'the cap ({cap_gib:g} GiB) exceeds the device '
                    f'({total / GIB:.0f} GiB): the whole device')
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    else:
        note = f'CPU: no cap enforced, batches tried up to {max_batch}'
    common = dict(solver_runs=solver_runs, cap_mib=cap_bytes / MIB,
                  cap_enforced=enforced, max_batch=max_batch, note=note)
    try:
        model = build_maps(case.backbone, case.solver).to(device).train()
    except Exception as error:
        return case.capacity_record('error', error='build failed: '
                                    f'{describe_error(error)}', **common)
    probes = []
    dtype = AUTOCAST_DTYPES[case.dtype]

    def fits(batch: int) -> bool:
        probe = dict(batch=batch, fits=False, max_memory_mib=None, time_ms=None)
        probes.append(probe)
        free_memory(device)
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats(device)
        try:
            images = torch.randn(batch, 3, *case.size, device=device)
            _synchronize(device)
            start = time.perf_counter()
            run_once(model, images, True, dtype)
            _synchronize(device)
            probe['time_ms'] = (time.perf_counter() - start) * 1e3
        except Exception as error:
            if not _is_out_of_memory(error):
                raise
            model.zero_grad(set_to_none=True)
            return False
        finally:
            images = None
            if device.type == 'cuda':
                probe['max_memory_mib'] = torch.cuda.max_memory_allocated(device) / MIB
        probe['fits'] = True
        return True

    try:
        largest, limit_reached = largest_fitting_batch(fits, max_batch)
    except Exception as error:
        return case.capacity_record('error', probes=probes,
                                    error=describe_error(error), **common)
    finally:
        free_memory(device)
    return case.capacity_record('ok', largest_batch=largest,
                                limit_reached=limit_reached, probes=probes,
                                **common)


def measure_in_subprocess(case: Case, device: torch.device, warmup: int,
                          repeats: int, timeout_s: float, compile_backend: str,
                          capacity: Tuple[float, int] = (CAPACITY_CAP_GIB, 2),
                          on_record: Callable[[Dict], None] = lambda r: None,
                          cpu_threads: int = CPU_THREADS) -> List[Dict]:
    """Runs ``case`` in a child process killed after ``timeout_s`` seconds:
    a hung or runaway case costs no more than that.

    Args:
        capacity (tuple[float, int]): The cap (GiB) and batch limit of a
            capacity case.
        on_record (callable): Called with each record.
        cpu_threads (int): torch's threads in the child on the CPU.

    Returns:
        list[dict]: One record per mode (one capacity record in that phase);
        the modes the child did not report are error records saying why
        (timed out, or the process died).
    """
    request = dict(case=dataclasses.asdict(case), device=str(device),
                   warmup=warmup, repeats=repeats, compile_backend=compile_backend,
                   capacity=list(capacity), cpu_threads=cpu_threads)
    child = run_child(worker_command('gpu_check', json.dumps(request)), timeout_s)
    if child.timed_out:
        failure = (f'timed out after {timeout_s:.0f} s (the hard limit of a case, '
                   'or what was left of the budget)')
    else:
        failure = f"the case's process died: {child.last_error_line()}"
    records = child.results
    modes = ('capacity', ) if case.phase == 'capacity' else case.modes
    reported = {record['mode'] for record in records}
    for mode in modes:
        if mode not in reported:
            error = failure[:300]
            records.append(case.capacity_record('error', error=error)
                           if mode == 'capacity' else case.record(mode, 'error',
                                                                  error=error))
    for record in records:
        on_record(record)
    return records


@dataclasses.dataclass
class ChildRun:
    """What a worker process left: its output, exit status (None when it
    was killed) and its ``RESULT <json>`` lines, parsed."""
    stdout: str
    stderr: str
    returncode: Optional[int]
    timed_out: bool

    @property
    def results(self) -> List[Dict]:
        """The objects of the ``RESULT <json>`` lines, in order."""
        return [json.loads(line[len('RESULT '):]) for line in self.stdout.splitlines()
                if line.startswith('RESULT ')]

    def last_error_line(self) -> str:
        """The last line of its error output, or its exit status."""
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f'exit status {self.returncode}'


def run_child(command: Sequence[str], timeout_s: float) -> ChildRun:
    """Runs a worker (``command``, from the repository, with
    :func:`~mmsoft_analysis.worker_env`), killed with its children after
    ``timeout_s`` seconds: a hung or runaway worker costs no more than that."""
    process = subprocess.Popen(list(command), cwd=REPO, env=worker_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_process_tree(process.pid)
        stdout, stderr = process.communicate()
        timed_out = True
    return ChildRun(stdout, stderr, None if timed_out else process.returncode,
                    timed_out)


def _child_pids(pid: int) -> List[int]:
    """The processes whose parent is ``pid`` (Linux's ``/proc``)."""
    children = []
    for entry in os.listdir('/proc') if os.path.isdir('/proc') else []:
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as stat:
                fields = stat.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children


def kill_process_tree(pid: int) -> None:
    """Kills process ``pid`` and its descendants (the compiler's workers of
    a compiled case, say), the descendants first found while they still have
    their parents."""
    pids, index = [pid], 0
    while index < len(pids):
        pids += _child_pids(pids[index])
        index += 1
    for victim in reversed(pids):
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _worker_main(request: str) -> None:
    """Child process of :func:`measure_in_subprocess`: one case, one
    ``RESULT <json>`` line per record, printed as it is made."""
    request = json.loads(request)
    fields = request['case']
    case = Case(**dict(fields, size=tuple(fields['size']),
                       modes=tuple(fields['modes'])))
    device = torch.device(request['device'])
    if device.type == 'cpu':
        torch.set_num_threads(request['cpu_threads'])

    def emit(record: Dict) -> None:
        print('RESULT ' + json.dumps(record), flush=True)

    if case.phase == 'capacity':
        cap_gib, max_batch = request['capacity']
        emit(run_capacity(case, device, cap_gib, max_batch))
    else:
        run_case(case, device, request['warmup'], request['repeats'],
                 request['compile_backend'], emit)


def skipped_records(case: Case, note: Optional[str] = None) -> List[Dict]:
    """The records of a case that is not run."""
    if case.phase == 'capacity':
        return [case.capacity_record('skipped', note=note)]
    return [case.record(mode, 'skipped', note=note) for mode in case.modes]


def run_benchmark(cases: Sequence[Case], device: torch.device, budget_s: float,
                  warmup: int = 1, repeats: int = 3,
                  on_record: Callable[[Dict], None] = lambda record: None,
                  clock: Callable[[], float] = time.monotonic,
                  case_timeout_s: Optional[float] = DEFAULT_CASE_TIMEOUT_S,
                  compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                  compile_backend: str = 'inductor',
                  capacity: Tuple[float, int] = (CAPACITY_CAP_GIB, 2),
                  cpu_threads: int = CPU_THREADS) -> List[Dict]:
    """Measures ``cases`` in order until ``budget_s`` seconds are spent.

    With ``case_timeout_s`` (the default), each case runs in its own child
    process (:func:`measure_in_subprocess`), killed after ``case_timeout_s``
    (``compile_timeout_s`` for a compiled case) or when the budget runs
    out, whichever comes first: the benchmark never runs past its budget.
    With None, the cases run in this process (tests), the budget checked
    between cases. A case whose backbone cannot be built here (its framework
    is missing) is skipped at once, saying why.

    Returns:
        list[dict]: The records, in order (see :meth:`Case.record`).
    """
    start = clock()
    records = []

    def add(record: Dict) -> None:
        records.append(record)
        on_record(record)

    for case in cases:
        left = budget_s - (clock() - start)
        reason = unavailable_reason(case.backbone)
        if reason is not None:
            for record in skipped_records(case, reason):
                add(record)
        elif left <= 0:
            for record in skipped_records(case, 'the budget was spent'):
                add(record)
        elif case_timeout_s is not None:
            limit = compile_timeout_s if case.compiled else case_timeout_s
            measure_in_subprocess(case, device, warmup, repeats, min(limit, left),
                                  compile_backend, capacity, on_record=add,
                                  cpu_threads=cpu_threads)
        elif case.phase == 'capacity':
            add(run_capacity(case, device, *capacity))
        else:
            run_case(case, device, warmup, repeats, compile_backend, add)
    return records


def junit_counts(path: str) -> Dict:
    """Outcome counts of a pytest JUnit XML report.

    Returns:
        dict: ``total``, ``passed``, ``failed``, ``errors``, ``skipped`` and
        ``failed_tests`` (``'classname::name'`` of each failure or error).
    """
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))
    counts = {key: sum(int(s.get(attr, 0)) for s in suites)
              for key, attr in (('total', 'tests'), ('failed', 'failures'),
                                ('errors', 'errors'), ('skipped', 'skipped'))}
    counts['passed'] = (counts['total'] - counts['failed'] - counts['errors'] -
                        counts['skipped'])
    counts['failed_tests'] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter('testcase')
        if case.find('failure') is not None or case.find('error') is not None]
    return counts


def _output_tail(text: str) -> str:
    return '\n'.join(text.strip().splitlines()[-OUTPUT_TAIL_LINES:])


def run_tests(paths: Sequence[str] = CUDA_TESTS,
              timeout_s: float = DEFAULT_TESTS_TIMEOUT_S) -> Dict:
    """Runs pytest on ``paths`` in a child process (from the repository).

    Returns:
        dict: ``ran`` (True), ``command``, ``returncode`` (None on timeout),
        ``seconds``, the :func:`junit_counts` fields when pytest wrote its
        report, ``error`` when it did not, and ``output_tail``.
    """
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, 'junit.xml')
        command = [sys.executable, '-m', 'pytest', *paths, '-q', '-p',
                   'no:cacheprovider', f'--junitxml={report}']
        start = time.monotonic()
        outcome = dict(ran=True, command=' '.join(command[:-1]))
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout_s)
            outcome.update(returncode=done.returncode,
                           output_tail=_output_tail(done.stdout + done.stderr))
        except subprocess.TimeoutExpired:
            outcome.update(returncode=None, error=f'timed out after {timeout_s:g} s')
        outcome['seconds'] = time.monotonic() - start
        if os.path.exists(report):
            outcome.update(junit_counts(report))
        else:
            outcome.setdefault('error', 'pytest wrote no report')
    return outcome


def _package_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_cpu() -> str:
    """The host's CPU model (Linux's ``/proc/cpuinfo``, else ``platform``)
    and its logical cores, e.g. ``'AMD EPYC 9454 48-Core Processor, 16 cores'``."""
    model = None
    try:
        with open('/proc/cpuinfo') as cpuinfo:
            model = next((line.split(':', 1)[1].strip() for line in cpuinfo
                          if line.startswith('model name')), None)
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or 'unknown CPU'
    return f'{model}, {os.cpu_count()} cores'


def environment(device: torch.device) -> Dict:
    """The device's name and the software that ran on it, the host's CPU and
    the float32 matmul settings (TF32)."""
    import mmsoft
    if device.type == 'cuda':
        properties = torch.cuda.get_device_properties(device)
        name, memory = properties.name, properties.total_memory / GIB
    else:
        name, memory = platform.processor() or platform.machine(), None
    return dict(device=str(device), device_name=name, device_memory_gib=memory,
                torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                tf32_cudnn=torch.backends.cudnn.allow_tf32,
                float32_matmul_precision=torch.get_float32_matmul_precision(),
                host_cpu=host_cpu(),
                python=platform.python_version(), threads=torch.get_num_threads(),
                packages={p: _package_version(p) for p in PACKAGES},
                mmsoft_path=os.path.dirname(os.path.abspath(mmsoft.__file__)),
                date=time.strftime('%Y-%m-%d %H:%M:%S %Z'))


def solver_note(solvers: Sequence[str], device_type: str) -> str:
    """One sentence on how SOFT++'s ``solvers`` run on ``device_type``."""
    if 'newton_closed_form' not in solvers:
        return ''
    if solver_that_runs('newton_closed_form', device_type) == 'newton':
        return (f"On {device_type}, 'newton_closed_form' (the configs' solver) runs "
                f"the Newton iteration itself ('newton'): its rows are the "
                f"iteration's figures, so 'newton' is not measured again.")
    return (f"On {device_type}, 'newton_closed_form' computes the Newton "
            f"iteration's result in closed form (one eigendecomposition).")


def record_label(record: Dict) -> str:
    """A record's case label and mode, e.g.
    ``'soft++-tiny/newton_closed_form bfloat16 800x1333 train'``."""
    name = (record['backbone'] + (f"/{record['solver']}" if record['solver'] else '')
            + ('+compiled' if record.get('compiled') else ''))
    return (f"{name} {record['dtype']} {record['height']}x{record['width']} "
            f"{record['mode']}")


def describe_record(record: Dict) -> str:
    """One line of progress for a record."""
    if record['status'] == 'ok' and record['mode'] == 'capacity':
        outcome = (f"largest batch {record['largest_batch']}"
                   + (' (the search limit)' if record['limit_reached'] else ''))
    elif record['status'] == 'ok':
        memory = ('' if record['max_memory_mib'] is None
                  else f", {record['max_memory_mib']:.0f} MiB")
        outcome = (f"{record['time_ms']:.1f} ms, {record['images_per_s']:.1f} "
                   f"img/s{memory}")
    else:
        detail = record['error'] or record.get('note')
        outcome = record['status'] + (f': {detail}' if detail else '')
    return f'{record_label(record)}: {outcome}'


def _host_sync_counts(record: Dict) -> bool:
    """Whether a host sync of ``record`` fails the check: mmsoft's backbones
    only (the peers' syncs are reported), the ``'exact'`` solver's LAPACK
    checks excepted."""
    return (record.get('host_sync') not in (None, 'none')
            and is_mmsoft(record['backbone']) and record['solver'] != 'exact')


def capacity_ratios(records: Sequence[Dict]) -> Dict[str, float]:
    """Each capacity record's largest batch over :data:`CAPACITY_REFERENCE`'s."""
    batches = {r['backbone']: r['largest_batch'] for r in records
               if r['mode'] == 'capacity' and r['status'] == 'ok'}
    reference = batches.get(CAPACITY_REFERENCE)
    if not reference:
        return {}
    return {name: batch / reference for name, batch in batches.items()
            if name != CAPACITY_REFERENCE}


def summarise(records: Sequence[Dict]) -> Dict:
    """Record counts by status, the labels of the skipped records, those that
    synchronised with the host (:func:`_host_sync_counts`), and the capacity
    ratios."""
    counts = {status: sum(r['status'] == status for r in records)
              for status in ('ok', 'error', 'skipped')}
    counts['skipped_cases'] = [record_label(r) for r in records
                               if r['status'] == 'skipped']
    counts['failed_cases'] = [record_label(r) for r in records
                              if r['status'] == 'error']
    counts['host_sync_cases'] = [record_label(r) for r in records
                                 if _host_sync_counts(r)]
    counts['capacity_vs_' + CAPACITY_REFERENCE] = capacity_ratios(records)
    return counts


def _write_atomically(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + '.partial'
    with open(partial, 'w') as file:
        file.write(text)
    os.replace(partial, path)


def write_json(path: str, data: Dict) -> None:
    """Writes ``data`` to ``path`` (folders created), replacing it whole."""
    _write_atomically(path, json.dumps(data, indent=2) + '\n')


def _cell(value, digits: int = 1) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:.{digits}f}'
    return str(value).replace('|', '\\|').replace('\n', ' ')


def _status_cell(record: Dict) -> str:
    detail = record['error'] or record.get('note')
    return _cell(record['status'] + (f': {detail}' if detail else ''))


def _solver_cell(record: Dict) -> str:
    if not record['solver']:
        return '-'
    if record.get('solver_runs') and record['solver_runs'] != record['solver']:
        return f"{record['solver']} (runs {record['solver_runs']})"
    return record['solver']


def format_markdown(data: Dict) -> str:
    """The results as Markdown: the setting, the tests, one table of the
    measurements, one of the capacity search, and the counts."""
    meta, tests = data.get('meta', {}), data.get('tests', {})
    records = data.get('records', [])
    lines = ['# GPU check', '',
             f"{meta.get('device_name')} ({meta.get('device')}), torch "
             f"{meta.get('torch')}, CUDA {meta.get('cuda')}, Python "
             f"{meta.get('python')}, {meta.get('date')}.", '']
    if meta.get('device') == 'cpu':
        lines += ['CPU smoke mode: the memory and host-sync columns are CUDA-only '
                  'and the times are not GPU figures.', '']
    if meta.get('solver_note'):
        lines += [meta['solver_note'], '']
    lines += [describe_tests(tests) + '.', '',
              f"Batch {meta.get('batch', BATCH)}; mmsoft's backbones with valid "
              f"regions (the second image 3/4 of each side), the peers without. "
              f"Time: median of {meta.get('repeats')} calls after "
              f"{meta.get('warmup')} warm-up; memory: "
              f"`torch.cuda.max_memory_allocated` of one call.", '']
    header = ('phase', 'backbone', 'solver', 'dtype', 'size', 'mode', 'time ms',
              'images/s', 'max MiB', 'host sync', 'status')
    lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for r in records:
        if r['mode'] == 'capacity':
            continue
        backbone = r['backbone']
        if r['compiled']:
            compiled_in = ('' if r.get('compile_s') is None
                           else f", compiled in {r['compile_s']:.0f} s")
            backbone += f" ({r['compile_backend']}{compiled_in})"
        lines.append('| ' + ' | '.join([
            r['phase'], backbone, _solver_cell(r), r['dtype'],
            f"{r['height']}x{r['width']}", r['mode'], _cell(r['time_ms']),
            _cell(r['images_per_s']), _cell(r['max_memory_mib'], 0),
            _cell(r['host_sync']), _status_cell(r)]) + ' |')
    capacity = [r for r in records if r['mode'] == 'capacity']
    if capacity:
        ratios = capacity_ratios(records)
        lines += ['', 'Largest training batch within the memory cap (capacity '
                  'phase):', '',
                  '| backbone | dtype | size | cap MiB | largest batch | '
                  f'x {CAPACITY_REFERENCE} | batches tried | status |',
                  '|---|---|---|---|---|---|---|---|']
        for r in capacity:
            tried = ', '.join(f"{p['batch']}{'' if p['fits'] else ' (no)'}"
                              for p in r.get('probes') or [])
            largest = r.get('largest_batch')
            if largest is not None and r.get('limit_reached'):
                largest = f'>= {largest}'
            lines.append('| ' + ' | '.join([
                r['backbone'], r['dtype'], f"{r['height']}x{r['width']}",
                _cell(r.get('cap_mib'), 0)
                + ('' if r.get('cap_enforced') in (None, True) else ' (not enforced)'),
                _cell(largest), _cell(ratios.get(r['backbone']), 2), tried or '-',
                _status_cell(r)]) + ' |')
    summary = data.get('summary', {})
    lines += ['', f"{summary.get('ok', 0)} measured, {summary.get('error', 0)} "
              f"failed, {summary.get('skipped', 0)} skipped; benchmark budget "
              f"{_cell(meta.get('benchmark_budget_s', meta.get('budget_s')), 0)} s."]
    if summary.get('host_sync_cases'):
        lines += ['', 'Host syncs in: ' + ', '.join(summary['host_sync_cases']) + '.']
    return '\n'.join(lines) + '\n'


def describe_tests(tests: Dict) -> str:
    """One line on the test run."""
    if not tests.get('ran'):
        return 'tests: not run'
    if 'total' not in tests:
        return f"tests: {tests['error']}"
    return ('tests: {passed} passed, {failed} failed, {errors} errors, '
            '{skipped} skipped in {seconds:.0f} s'.format(**tests))


def write_results(settings: CheckSettings, data: Dict) -> None:
    """Writes the results file and its Markdown table."""
    data['summary'] = summarise(data['records'])
    write_json(settings.out, data)
    _write_atomically(settings.markdown, format_markdown(data))


def run_check(settings: CheckSettings,
              log: Callable[[str], None] = print) -> Dict:
    """Runs the tests and the benchmark, writing the results as it goes.

    Args:
        settings (CheckSettings): What to run and where to write.
        log (callable): Receives progress lines. Default: ``print``.

    Returns:
        dict: The results file's content: ``meta``, ``tests``, ``records``
        and ``summary``.

    Raises:
        RuntimeError: When ``settings.device`` is CUDA and there is none.
    """
    check_start = time.monotonic()
    device = require_device(settings.device)
    cases = make_cases(settings, device.type)
    meta = environment(device)
    meta.update(budget_s=settings.budget_s, total_budget_s=settings.total_budget_s,
                warmup=settings.warmup,
                repeats=settings.repeats, batch=BATCH, cases=len(cases),
                phases=list(settings.phases),
                case_timeout_s=settings.case_timeout_s,
                cpu_threads=settings.cpu_threads if device.type == 'cpu' else None,
                compile_timeout_s=settings.compile_timeout_s,
                compile_backend=settings.compile_backend,
                solvers_on_device={s: solver_that_runs(s, device.type)
                                   for s in settings.solvers},
                solver_note=solver_note(settings.solvers, device.type),
                capacity=dict(size=list(settings.capacity_size),
                              cap_gib=settings.capacity_cap_gib,
                              max_batch=settings.capacity_max_batch,
                              dtype=CAPACITY_DTYPE))
    data = dict(meta=meta, tests=dict(ran=False), records=[], summary={})
    write_results(settings, data)
    if settings.run_tests:
        log(f'running {" ".join(settings.tests)} ...')
        tests_timeout_s = settings.tests_timeout_s
        if settings.total_budget_s is not None:
            tests_timeout_s = min(tests_timeout_s, settings.total_budget_s)
        data['tests'] = run_tests(settings.tests, tests_timeout_s)
        log(describe_tests(data['tests']))
        write_results(settings, data)

    def on_record(record: Dict) -> None:
        data['records'].append(record)
        write_results(settings, data)
        log(f"[{len(data['records'])}] {record['phase']}: {describe_record(record)}")

    budget_s = settings.budget_s
    if settings.total_budget_s is not None:
        spent = time.monotonic() - check_start
        budget_s = max(0., min(budget_s, settings.total_budget_s - spent
                               - FINISH_MARGIN_S))
    meta['benchmark_budget_s'] = budget_s
    log(f'{len(cases)} cases in phases {", ".join(settings.phases)}; budget '
        f'{budget_s:.0f} s')
    start = time.monotonic()
    run_benchmark(cases, device, budget_s, settings.warmup,
                  settings.repeats, on_record, case_timeout_s=settings.case_timeout_s,
                  compile_timeout_s=settings.compile_timeout_s,
                  compile_backend=settings.compile_backend,
                  capacity=(settings.capacity_cap_gib, settings.capacity_max_batch),
                  cpu_threads=settings.cpu_threads)
    meta['benchmark_seconds'] = time.monotonic() - start
    write_results(settings, data)
    return data


def check_passed(data: Dict) -> bool:
    """Whether the tests (when run) passed, no measurement failed and no
    case of mmsoft's backbones but the ``'exact'`` solver's synchronised
    with the host."""
    tests = data['tests']
    tests_ok = not tests.get('ran') or tests.get('returncode') == 0
    return (tests_ok and data['summary'].get('error', 0) == 0
            and not data['summary'].get('host_sync_cases'))


if __name__ == '__main__':
    _worker_main(sys.argv[1])
