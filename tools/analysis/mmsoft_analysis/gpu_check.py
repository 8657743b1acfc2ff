"""A GPU check in one run: the CUDA tests, then a short timed benchmark.

:func:`run_check` runs ``pytest tests/test_cuda.py`` in a child process,
then measures, in this process, one training step (forward + backward of
the sum of the four maps' means, no GradScaler) and one inference forward
(no gradients) of each backbone at batch 2 with valid regions, as the
configs' data preprocessors give them (the second image three quarters of
the canvas on each side), once under CUDA's sync debug mode (``host_sync``):

- mmdet's Swin-T and PVTv2-b2, UFO-ViT-small (on CUDA also with its
  BatchNorms converted to SyncBatchNorm, as mmengine's ``sync_bn`` does;
  UFO-ViT-small and SOFT++-tiny through ``torch.compile`` too, in float32
  at the first size), and SOFT++-tiny and
  SOFT++-small once per solver (``'newton_closed_form'``, the configs'
  solver, then ``'newton'`` and ``'exact'``): each the backbone of its 1x
  COCO Mask R-CNN config
  (:data:`~mmsoft_analysis.detector_step.DETECTOR_CONFIGS`: the shipped
  configs' settings such as ``max_bottleneck_tokens``, mmdet's own for
  Swin-T and PVTv2-b2), built from the registry without its checkpoint and
  initialised from scratch;
- in float32 and under ``torch.autocast`` to float16;
- at 800x1333, then at 1536x1536 (all of one size before the next, so a
  spent budget cuts the larger size, not the last backbones).

Each measurement reports the median CUDA-synchronised wall time of a few
calls after warm-up (``time_ms``) and ``torch.cuda.max_memory_allocated``
of one more call after resetting the peak (``max_memory_mib``, weights and
input included; ``memory_above_start_mib`` is the part above what was held
before the call). On CPU (a smoke run) the memory fields are None. A failed
or out-of-memory measurement records its error and the run goes on. Once
the time budget is spent, the remaining measurements are recorded as
skipped. The results file is rewritten after every measurement, so a run
cut short still leaves what it measured.
"""
import copy
import dataclasses
import functools
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmsoft.apis.runner import build_in_scope
from mmsoft.models.soft_kernels import SOLVERS, solver_that_runs
from mmsoft.openmmlab.backbones import register_valid_shapes
from mmsoft.utils import check_choice, check_positive_int

from . import REPO, worker_command, worker_env
from .detector_step import detector_config
from .measure import peak_memory_of, run_once, timing_fields

CUDA_TESTS = (str(REPO / 'tests' / 'test_cuda.py'), )
SOFT_BACKBONES = ('soft++-tiny', 'soft++-small')
# Measured in this order at each size: the references first, the slowest last.
#: UFO-ViT-small with every BatchNorm a SyncBatchNorm, as mmengine's
#: ``sync_bn='torch'`` converts it (CUDA only: SyncBatchNorm trains on GPUs).
SYNC_BN_SUFFIX = '+syncbn'
#: ``torch.compile`` (inductor) of the backbone: measured in float32 at the
#: first size only (each case compiles anew, in its own process).
COMPILED_SUFFIX = '+compiled'
COMPILED_BACKBONES = ('ufo-vit-small' + COMPILED_SUFFIX,
                      'soft++-tiny' + COMPILED_SUFFIX)
BACKBONES = ('swin-t', 'pvtv2-b2', 'ufo-vit-small', 'ufo-vit-small' + SYNC_BN_SUFFIX
             ) + SOFT_BACKBONES + COMPILED_BACKBONES
# The shipped configs' solver first.
DEFAULT_SOLVERS = ('newton_closed_form', ) + tuple(s for s in SOLVERS
                                                   if s != 'newton_closed_form')
# Autocast dtype per dtype name; None runs in float32 without autocast.
AUTOCAST_DTYPES = {'float32': None, 'float16': torch.float16,
                   'bfloat16': torch.bfloat16}
DTYPES = ('float32', 'float16')
MODES = ('train', 'inference')
SIZES = ((800, 1333), (1536, 1536))
DEFAULT_BUDGET_S = 360.
DEFAULT_TESTS_TIMEOUT_S = 120.
DEFAULT_CASE_TIMEOUT_S = 180.
DEFAULT_OUT = 'work_dirs/gpu_check/gpu_check.json'
CPU_SMOKE_COMMAND = ('python tools/analysis/gpu_check.py --device cpu '
                     '--sizes 64x64 --repeats 1 --skip-tests')
PACKAGES = ('torch', 'mmcv', 'mmengine', 'mmdet', 'mmsegmentation', 'mmsoft')
MIB = 2**20
#: Images per call, the second with a smaller valid region (:func:`valid_regions`).
BATCH = 2
OUTPUT_TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a backbone (with a solver for SOFT++), a dtype, an
    input size (H, W) and a mode (``'train'`` or ``'inference'``)."""
    backbone: str
    solver: Optional[str]
    dtype: str
    size: Tuple[int, int]
    mode: str

    @property
    def model_key(self) -> Tuple[str, Optional[str]]:
        """What the model is built from: the backbone and its solver."""
        return self.backbone, self.solver

    def label(self) -> str:
        """E.g. ``'soft++-tiny/newton float16 800x1333 train'``."""
        name = self.backbone + (f'/{self.solver}' if self.solver else '')
        return f'{name} {self.dtype} {self.size[0]}x{self.size[1]} {self.mode}'

    def record(self, status: str, **fields) -> Dict:
        """The case's result record with ``status`` and measured ``fields``.

        Args:
            status (str): ``'ok'``, ``'error'`` or ``'skipped'``.
            **fields: Values replacing the record's None defaults.

        Returns:
            dict: ``backbone``, ``solver``, ``dtype``, ``height``, ``width``,
            ``mode``, ``status``, ``host_sync`` (on CUDA: ``'none'`` or the
            first synchronisation's error), ``time_ms``, ``all_time_ms``,
            ``max_memory_mib``, ``memory_above_start_mib``, ``params_m`` and
            ``error``.
        """
        record = dict(backbone=self.backbone, solver=self.solver, dtype=self.dtype,
                      height=self.size[0], width=self.size[1], mode=self.mode,
                      status=status, host_sync=None, time_ms=None, all_time_ms=None,
                      max_memory_mib=None, memory_above_start_mib=None,
                      params_m=None, error=None)
        record.update(fields)
        return record


@dataclasses.dataclass
class CheckSettings:
    """What :func:`run_check` runs.

    Args:
        out (str): The results file (JSON). Default: :data:`DEFAULT_OUT`.
        device (str): ``'cuda'`` (or ``'cuda:N'``), or ``'cpu'`` for a smoke
            run. Default: ``'cuda'``.
        backbones (Sequence[str]): Names among :data:`BACKBONES`.
        solvers (Sequence[str]): SOFT++ solvers among ``SOLVERS``.
            Default: :data:`DEFAULT_SOLVERS`.
        dtypes (Sequence[str]): Names among :data:`AUTOCAST_DTYPES`.
        sizes (Sequence[tuple[int, int]]): Input sizes (H, W).
        modes (Sequence[str]): Among :data:`MODES`.
        budget_s (float): Seconds of benchmark after which the remaining
            measurements are skipped. Default: :data:`DEFAULT_BUDGET_S`.
        warmup (int): Untimed calls before timing. Default: 1.
        repeats (int): Timed calls (the median is reported). Default: 3.
        run_tests (bool): Run the CUDA tests first. Default: True.
        tests (Sequence[str]): The pytest paths. Default: :data:`CUDA_TESTS`.
        tests_timeout_s (float): Limit of the test run.
            Default: :data:`DEFAULT_TESTS_TIMEOUT_S`.
        case_timeout_s (float): Hard limit of each case, run in its own
            process. Default: :data:`DEFAULT_CASE_TIMEOUT_S`.
    """
    out: str = DEFAULT_OUT
    device: str = 'cuda'
    backbones: Sequence[str] = BACKBONES
    solvers: Sequence[str] = DEFAULT_SOLVERS
    dtypes: Sequence[str] = DTYPES
    sizes: Sequence[Tuple[int, int]] = SIZES
    modes: Sequence[str] = MODES
    budget_s: float = DEFAULT_BUDGET_S
    warmup: int = 1
    repeats: int = 3
    run_tests: bool = True
    tests: Sequence[str] = CUDA_TESTS
    tests_timeout_s: float = DEFAULT_TESTS_TIMEOUT_S
    case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S

    def __post_init__(self):
        check_positive_int('repeats', self.repeats)
        for name in ('warmup', 'budget_s', 'tests_timeout_s', 'case_timeout_s'):
            _check_non_negative(name, getattr(self, name))


def _check_non_negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f'{name}={value!r} is invalid; expected a number >= 0.')


def require_device(device: str) -> torch.device:
    """The device to measure on, refusing CUDA where there is none.

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
            f'{torch.version.cuda}). Run the GPU check on a machine with a CUDA '
            f'GPU and a CUDA build of torch, or run only the benchmark part, on '
            f'CPU at a tiny size, as a smoke test: {CPU_SMOKE_COMMAND}')
    return parsed


def make_cases(backbones: Sequence[str], solvers: Sequence[str],
               dtypes: Sequence[str], sizes: Sequence[Tuple[int, int]],
               modes: Sequence[str], device_type: str = 'cuda') -> List[Case]:
    """Every distinct case, in the order they are measured.

    Sizes come first (in the given order), so that a spent budget skips the
    last size of every backbone rather than every size of the last
    backbones; within a size the cases of one model (backbone, solver)
    follow each other, so it is built once per size. SOFT++ backbones get
    one model per solver that runs on ``device_type``
    (:func:`~mmsoft.models.ops.kernel_inverse.solver_that_runs`: on
    a GPU ``'newton_closed_form'`` is the iteration, measured once, as
    ``'newton'``), the others none. The SyncBatchNorm variant
    (:data:`SYNC_BN_SUFFIX`) runs on CUDA only; the compiled ones
    (:data:`COMPILED_SUFFIX`) in float32 at the first size only.

    Raises:
        ValueError: On an unknown backbone, solver, dtype or mode.
    """
    for name, values, choices in (('backbone', backbones, BACKBONES),
                                  ('solver', solvers, SOLVERS),
                                  ('dtype', dtypes, AUTOCAST_DTYPES),
                                  ('mode', modes, MODES)):
        for value in values:
            check_choice(name, value, choices)
    paths = list(dict.fromkeys(solver_that_runs(s, device_type) for s in solvers))
    if device_type != 'cuda':
        backbones = [b for b in backbones if not b.endswith(SYNC_BN_SUFFIX)]
    models = [(b, s) for b in backbones
              for s in (paths if base_backbone(b) in SOFT_BACKBONES else (None, ))]
    cases = [Case(backbone, solver, dtype, tuple(size), mode)
             for size in sizes for backbone, solver in models
             for dtype in dtypes for mode in modes]
    return [case for case in cases if not case.backbone.endswith(COMPILED_SUFFIX)
            or (case.dtype == 'float32' and case.size == tuple(sizes[0]))]


def base_backbone(name: str) -> str:
    """``name`` without its variant suffix (SyncBatchNorm, compiled)."""
    for suffix in (SYNC_BN_SUFFIX, COMPILED_SUFFIX):
        name = name.replace(suffix, '')
    return name


@functools.lru_cache(maxsize=None)
def _config_backbone(name: str) -> Dict:
    return detector_config(name).model.backbone.to_dict()


def backbone_config(name: str, solver: Optional[str] = None) -> Dict:
    """The backbone of ``name``'s Mask R-CNN config, without its checkpoint.

    Args:
        name (str): One of :data:`BACKBONES`.
        solver (str, optional): The SOFT++ solver replacing the config's.
            Default: None (keep the config's).

    Returns:
        dict: A registry config (``init_cfg`` None).
    """
    check_choice('backbone', name, BACKBONES)
    config = copy.deepcopy(_config_backbone(base_backbone(name)))
    config['init_cfg'] = None
    if solver is not None:
        config['solver'] = solver
    return config


def build_check_backbone(name: str, solver: Optional[str],
                         device: torch.device) -> nn.Module:
    """Backbone ``name`` (with ``solver``) from mmdet's registry scope,
    initialised from scratch, on ``device``."""
    torch.manual_seed(0)
    model = build_in_scope('mmdet', backbone_config(name, solver))
    model.init_weights()
    if name.endswith(SYNC_BN_SUFFIX):
        join_single_process_group(device)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if name.endswith(COMPILED_SUFFIX):
        model = torch.compile(model)
    return model


def join_single_process_group(device: torch.device) -> None:
    """A process group of this process alone (SyncBatchNorm trains only in
    one), NCCL on CUDA; kept when one exists."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo',
                                store=dist.HashStore(), rank=0, world_size=1)


def memory_fields(call: Callable[[], object], device: torch.device) -> Dict:
    """``max_memory_mib`` and ``memory_above_start_mib`` of one ``call()``
    (None on CPU)."""
    if device.type != 'cuda':
        return dict(max_memory_mib=None, memory_above_start_mib=None)
    above_start = peak_memory_of(call, device)  # resets the peak first
    return dict(max_memory_mib=torch.cuda.max_memory_allocated(device) / MIB,
                memory_above_start_mib=above_start / MIB)


def measure_case(model: nn.Module, case: Case, device: torch.device,
                 warmup: int, repeats: int) -> Dict:
    """Time and memory of ``case`` on the already built ``model``.

    Returns:
        dict: ``time_ms`` (median), ``all_time_ms``, ``max_memory_mib``,
        ``memory_above_start_mib`` and ``params_m``.
    """
    torch.manual_seed(0)
    images = torch.randn(BATCH, 3, *case.size, device=device)  # (2, 3, H, W)
    # What the configs' ValidRegion*DataPreprocessor gives the backbone.
    register_valid_shapes(images, valid_regions(case.size))
    training = case.mode == 'train'
    model.train(training)
    dtype = AUTOCAST_DTYPES[case.dtype]
    call = lambda: run_once(model, images, training, dtype)  # noqa: E731
    timing = timing_fields(call, device, warmup, repeats)
    fields = dict(host_sync=host_sync_of(call, device),
                  time_ms=timing['seconds'] * 1e3,
                  all_time_ms=[s * 1e3 for s in timing['all_seconds']],
                  params_m=sum(p.numel() for p in model.parameters()) / 1e6)
    fields.update(memory_fields(call, device))
    return fields


def valid_regions(size: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The batch's valid regions: the whole canvas, then three quarters of
    each side (a padded second image)."""
    height, width = size
    return [(height, width), (max(1, 3 * height // 4), max(1, 3 * width // 4))]


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


def _measured_record(model: Optional[nn.Module], build_error: Optional[str],
                     case: Case, device: torch.device, warmup: int,
                     repeats: int) -> Dict:
    if model is None:
        return case.record('error', error=f'build failed: {build_error}')
    try:
        return case.record('ok', **measure_case(model, case, device, warmup, repeats))
    except Exception as error:  # an OOM or a failure must not stop the rest
        model.zero_grad(set_to_none=True)
        return case.record('error', error=describe_error(error))
    finally:
        free_memory(device)


def _built(case: Case, device: torch.device) -> Tuple[Optional[nn.Module],
                                                     Optional[str]]:
    try:
        return build_check_backbone(case.backbone, case.solver, device), None
    except Exception as error:
        return None, describe_error(error)


def measure_in_subprocess(case: Case, device: torch.device, warmup: int,
                          repeats: int, timeout_s: float) -> Dict:
    """Builds and measures ``case`` in a child process, killed after
    ``timeout_s`` seconds: a hung or runaway case costs no more than that.

    Returns:
        dict: The case's record (see :meth:`Case.record`); an error record
        when the child timed out or died without a result.
    """
    request = dict(case=dataclasses.asdict(case), device=str(device),
                   warmup=warmup, repeats=repeats)
    command = worker_command('gpu_check', json.dumps(request))
    try:
        done = subprocess.run(command, cwd=REPO, env=worker_env(),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return case.record('error', error=f'timed out after {timeout_s:.0f} s '
                           '(the hard limit of a case)')
    for line in done.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    last = (done.stderr.strip().splitlines() or [f'exit status {done.returncode}'])[-1]
    return case.record('error', error=f'the case\'s process died: {last}'[:300])


def _worker_main(request: str) -> None:
    """Child process of :func:`measure_in_subprocess`: one case, one
    ``RESULT <json>`` line."""
    request = json.loads(request)
    fields = request['case']
    case = Case(**dict(fields, size=tuple(fields['size'])))
    device = torch.device(request['device'])
    model, build_error = _built(case, device)
    record = _measured_record(model, build_error, case, device, request['warmup'],
                              request['repeats'])
    print('RESULT ' + json.dumps(record), flush=True)


def run_benchmark(cases: Sequence[Case], device: torch.device, budget_s: float,
                  warmup: int = 1, repeats: int = 3,
                  on_record: Callable[[Dict], None] = lambda record: None,
                  clock: Callable[[], float] = time.monotonic,
                  case_timeout_s: Optional[float] = DEFAULT_CASE_TIMEOUT_S
                  ) -> List[Dict]:
    """Measures ``cases`` in order until ``budget_s`` seconds are spent.

    With ``case_timeout_s`` (the default), each case runs in its own child
    process (:func:`measure_in_subprocess`), killed after ``case_timeout_s``
    or when the budget runs out, whichever comes first: the benchmark never
    runs past its budget. With None, the cases run in this process, one
    model held at a time (built when a case needs another (backbone,
    solver) than the last one), and the budget is checked between cases.

    Args:
        cases (Sequence[Case]): What to measure (see :func:`make_cases`).
        device (torch.device): Where.
        budget_s (float): Cases that start after this many seconds (builds
            included) are recorded as skipped, not measured.
        warmup (int): Untimed calls per case. Default: 1.
        repeats (int): Timed calls per case. Default: 3.
        on_record (callable): Called with each record as it is made.
            Default: does nothing.
        clock (callable): Seconds, monotonic. Default: ``time.monotonic``.
        case_timeout_s (float, optional): The hard limit of one case.
            Default: :data:`DEFAULT_CASE_TIMEOUT_S`.

    Returns:
        list[dict]: One record per case (see :meth:`Case.record`), in order.
    """
    start = clock()
    records, model, key, build_error = [], None, None, None
    for case in cases:
        left = budget_s - (clock() - start)
        if left <= 0:
            record = case.record('skipped')
        elif case_timeout_s is not None:
            record = measure_in_subprocess(case, device, warmup, repeats,
                                           min(case_timeout_s, left))
        else:
            if case.model_key != key:
                model = None
                free_memory(device)
                key = case.model_key
                model, build_error = _built(case, device)
            record = _measured_record(model, build_error, case, device, warmup,
                                      repeats)
        records.append(record)
        on_record(record)
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


def environment(device: torch.device) -> Dict:
    """The device's name and the software that ran on it."""
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return dict(device=str(device), device_name=name, torch=torch.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                tf32_cudnn=torch.backends.cudnn.allow_tf32,
                python=platform.python_version(), threads=torch.get_num_threads(),
                packages={p: _package_version(p) for p in PACKAGES},
                date=time.strftime('%Y-%m-%d %H:%M:%S %Z'))


def record_label(record: Dict) -> str:
    """The :meth:`Case.label` of a record."""
    return Case(record['backbone'], record['solver'], record['dtype'],
                (record['height'], record['width']), record['mode']).label()


def describe_record(record: Dict) -> str:
    """One line of progress for a record."""
    if record['status'] == 'ok':
        memory = ('' if record['max_memory_mib'] is None
                  else f", {record['max_memory_mib']:.0f} MiB")
        outcome = f"{record['time_ms']:.1f} ms{memory}"
    else:
        outcome = record['status'] + (f": {record['error']}" if record['error'] else '')
    return f'{record_label(record)}: {outcome}'


def summarise(records: Sequence[Dict]) -> Dict:
    """Record counts by status, the labels of the skipped cases and those
    of the cases that synchronised with the host (the ``'exact'`` solver's
    LAPACK checks excepted)."""
    counts = {status: sum(r['status'] == status for r in records)
              for status in ('ok', 'error', 'skipped')}
    counts['skipped_cases'] = [record_label(r) for r in records
                               if r['status'] == 'skipped']
    counts['host_sync_cases'] = [
        record_label(r) for r in records
        if r.get('host_sync') not in (None, 'none') and r['solver'] != 'exact']
    return counts


def write_json(path: str, data: Dict) -> None:
    """Writes ``data`` to ``path`` (folders created), replacing it whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + '.partial'
    with open(partial, 'w') as file:
        json.dump(data, file, indent=2)
    os.replace(partial, path)


def _cell(value: Optional[float]) -> str:
    return '-' if value is None else f'{value:.1f}'


def format_table(records: Sequence[Dict]) -> str:
    """The records as an aligned text table, one line per record."""
    header = ('backbone', 'solver', 'dtype', 'size', 'mode', 'time ms', 'max MiB',
              'status')
    rows = [header] + [
        (r['backbone'], r['solver'] or '-', r['dtype'], f"{r['height']}x{r['width']}",
         r['mode'], _cell(r['time_ms']), _cell(r['max_memory_mib']),
         r['status'] + (f": {r['error']}" if r['error'] else ''))
        for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    numeric = {5, 6}
    return '\n'.join(
        '  '.join([cell.rjust(w) if i in numeric else cell.ljust(w)
                   for i, (cell, w) in enumerate(zip(row, widths))] + [row[-1]])
        for row in rows)


def describe_tests(tests: Dict) -> str:
    """One line on the test run."""
    if not tests.get('ran'):
        return 'tests: not run'
    if 'total' not in tests:
        return f"tests: {tests['error']}"
    return ('tests: {passed} passed, {failed} failed, {errors} errors, '
            '{skipped} skipped in {seconds:.0f} s'.format(**tests))


def run_check(settings: CheckSettings,
              log: Callable[[str], None] = print) -> Dict:
    """Runs the tests and the benchmark, writing ``settings.out`` as it goes.

    Args:
        settings (CheckSettings): What to run and where to write.
        log (callable): Receives progress lines. Default: ``print``.

    Returns:
        dict: The results file's content: ``meta``, ``tests``, ``records``
        (one per case) and ``summary``.

    Raises:
        RuntimeError: When ``settings.device`` is CUDA and there is none.
    """
    device = require_device(settings.device)
    cases = make_cases(settings.backbones, settings.solvers, settings.dtypes,
                       settings.sizes, settings.modes, device.type)
    meta = environment(device)
    meta.update(budget_s=settings.budget_s, warmup=settings.warmup,
                repeats=settings.repeats, batch=BATCH, cases=len(cases),
                case_timeout_s=settings.case_timeout_s)
    data = dict(meta=meta, tests=dict(ran=False), records=[], summary={})
    if settings.run_tests:
        log(f'running {" ".join(settings.tests)} ...')
        data['tests'] = run_tests(settings.tests, settings.tests_timeout_s)
        log(describe_tests(data['tests']))
    write_json(settings.out, data)

    def on_record(record: Dict) -> None:
        data['records'].append(record)
        data['summary'] = summarise(data['records'])
        write_json(settings.out, data)
        log(f"[{len(data['records'])}/{len(cases)}] {describe_record(record)}")

    start = time.monotonic()
    run_benchmark(cases, device, settings.budget_s, settings.warmup,
                  settings.repeats, on_record, case_timeout_s=settings.case_timeout_s)
    meta['benchmark_seconds'] = time.monotonic() - start
    data['summary'] = summarise(data['records'])
    write_json(settings.out, data)
    return data


def check_passed(data: Dict) -> bool:
    """Whether the tests (when run) passed, no measurement failed and no
    case but the ``'exact'`` solver's synchronised with the host."""
    tests = data['tests']
    tests_ok = not tests.get('ran') or tests.get('returncode') == 0
    return (tests_ok and data['summary'].get('error', 0) == 0
            and not data['summary'].get('host_sync_cases'))


if __name__ == '__main__':
    _worker_main(sys.argv[1])
