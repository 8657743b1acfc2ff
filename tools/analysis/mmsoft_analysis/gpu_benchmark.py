"""The GPU benchmark: what mmdet users run, on one card, in one run.

Models: SOFT++-tiny, SOFT++-small and UFO-ViT-small as their COCO configs
build them, Swin-T and PVTv2-b2 (mmdet's where mmdet imports, else timm's,
named as such) and timm's PVTv2-b2-li (:mod:`mmsoft_analysis.gpu_backbones`).
Each model is measured in the phases asked for, in the order asked for,
the most important first, so that a spent budget cuts the least important:

- ``eager``: the backbone's training step (forward, loss, backward, AdamW
  step) and inference, float32 and mixed precision, on batch 2 of two
  COCO-like sizes (800x1199 and 800x1067 on an 800x1216 canvas, the valid
  regions that mmdet passes);
- ``memory``: the training step at 1536x1536, batch 1 (its memory; a short
  protocol: memory does not need many steps);
- ``detector``: a whole Mask R-CNN step, training and inference, batch 2
  (:mod:`mmsoft_analysis.gpu_benchmark_detectors`), with SOFT++-tiny and
  Swin-T (the target's pair);
- ``tests``: ``tests/test_cuda.py``;
- ``regions``: one profiled step per setting, each region's time, FLOP
  rate and kernels (a short protocol);
- ``detector-others``: the Mask R-CNN step with the other models;
- ``single``: the backbones at 800x1333, batch 1;
- ``compiled``: the backbones compiled (``torch.compile``), with the
  compile time.

Each (phase, model, round) runs in a fresh process, the models in turn,
the order reversed every other round. In each setting: warm-up steps, timed
steps (CUDA events), a few steps under ``torch.profiler`` for the kernels
and the GPU-busy time, and the memory peaks
(:mod:`mmsoft_analysis.gpu_benchmark_steps`). The results (JSON) and the
tables (Markdown, :mod:`mmsoft_analysis.gpu_benchmark_report`) are
rewritten after every measurement.
"""
import dataclasses
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from mmsoft.utils import check_positive_int

from . import REPO, worker_command
from .gpu_backbones import (MMSOFT_BACKBONES, build_maps, source_of,
                            unavailable_reason)
from .gpu_benchmark_detectors import (build_detector, choose_detector,
                                      import_problem)
from .gpu_benchmark_report import (aggregate, evaluate_targets, format_markdown,
                                   ratio_rows, summarise)
from .gpu_benchmark_steps import (AMP_DTYPES, MODES, PRECISIONS, InputSpec,
                                  autocast_dtype, inference_step, maps_loss,
                                  memory_fields, profile_activity, region_profile,
                                  reset_memory, time_steps, training_step)
from .gpu_check import (CUDA_TESTS, _check_non_negative, _write_atomically,
                        check_lists, describe_error, describe_tests, environment,
                        fill_output_defaults, free_memory, require_device,
                        run_child, run_tests, write_json)
from .measure import seconds_of

#: The benchmark's models, in the tables' order.
MODELS = ('soft++-tiny', 'soft++-small', 'ufo-vit-small', 'swin-t', 'pvtv2-b2',
          'pvtv2-b2-li')
LABELS = {'soft++-tiny': 'SOFT++-tiny', 'soft++-small': 'SOFT++-small',
          'ufo-vit-small': 'UFO-ViT-small', 'swin-t': 'Swin-T', 'pvtv2-b2': 'PVTv2-b2',
          'pvtv2-b2-li': 'PVTv2-b2-li'}
#: The peers mmdet has: model -> its backbone name there.
MMDET_PEERS = {'swin-t': 'mmdet-swin-t', 'pvtv2-b2': 'mmdet-pvtv2-b2'}
PEER_CHOICES = ('auto', 'timm', 'mmdet')
DETECTOR_CHOICES = ('auto', 'mmdet', 'torchvision')
#: The Mask R-CNN phases' models: the target's pair (the ``detector``
#: phase), then the others (``detector-others``).
DETECTOR_PAIR = ('soft++-tiny', 'swin-t')
DETECTOR_MODELS = ('soft++-tiny', 'swin-t', 'ufo-vit-small', 'soft++-small',
                   'pvtv2-b2', 'pvtv2-b2-li')
#: The models the memory targets name.
MEMORY_MODELS = ('soft++-tiny', 'ufo-vit-small', 'swin-t')
COCO_SHAPES = ((800, 1199), (800, 1067))  # 640x427 and 640x480 images resized
SINGLE_SHAPE = (800, 1333)
MEMORY_SHAPE = (1536, 1536)
#: The CPU smoke mode's inputs.
SMOKE_SHAPES = dict(coco=((32, 64), (32, 48)), single=((32, 48), ),
                    memory=((64, 64), ))
DEFAULT_OUT = 'work_dirs/gpu_benchmark/gpu_benchmark.json'
DEFAULT_BUDGET_S = 540.
DEFAULT_CASE_TIMEOUT_S = 240.
DEFAULT_COMPILE_TIMEOUT_S = 480.
DEFAULT_TESTS_TIMEOUT_S = 150.
#: A case is not started with less than this left of the budget.
MIN_CASE_S = 10.
CPU_SMOKE_COMMAND = 'python tools/analysis/gpu_benchmark.py --device cpu --smoke'


@dataclasses.dataclass(frozen=True)
class Phase:
    """A phase: which input, which protocol, which models by default.

    Args:
        name (str): Its name on the command line.
        input (str): ``'coco'``, ``'single'`` or ``'memory'`` (the settings'
            shapes); ``''`` for the tests.
        protocol (str): ``'timing'`` (the settings' rounds and steps),
            ``'memory'`` or ``'regions'`` (one round, few steps), ``'tests'``.
        modes (tuple[str, ...]): Its modes, in the order measured.
        models (str): Which of the settings' model lists: ``'models'``,
            ``'memory_models'`` or ``'detector_models'``.
        detector (bool): A whole Mask R-CNN instead of the backbone.
        compiled (bool): The backbone through ``torch.compile``.
        within (tuple[str, ...]): Only these of its models (all if empty).
        without (tuple[str, ...]): Not these of its models.
    """
    name: str
    input: str
    protocol: str
    modes: Tuple[str, ...] = MODES
    models: str = 'models'
    detector: bool = False
    compiled: bool = False
    within: Tuple[str, ...] = ()
    without: Tuple[str, ...] = ()


PHASES = {phase.name: phase for phase in (
    Phase('eager', 'coco', 'timing'),
    Phase('memory', 'memory', 'memory', modes=('train', ), models='memory_models'),
    Phase('detector', 'coco', 'timing', models='detector_models', detector=True,
          within=DETECTOR_PAIR),
    Phase('tests', '', 'tests', modes=()),
    Phase('regions', 'coco', 'regions'),
    Phase('detector-others', 'coco', 'timing', models='detector_models',
          detector=True, without=DETECTOR_PAIR),
    Phase('single', 'single', 'timing'),
    Phase('compiled', 'coco', 'timing', compiled=True),
)}
DEFAULT_PHASES = tuple(PHASES)
#: Steps of the short protocols: (warm-up, timed) at most.
SHORT_PROTOCOLS = {'memory': (2, 3), 'regions': (3, 5)}


@dataclasses.dataclass
class BenchmarkSettings:
    """What :func:`run_benchmark` runs (see ``tools/analysis/gpu_benchmark.py
    --help`` for each argument).

    ``steps`` is the number of timed steps of a setting over all its rounds
    (each round times ``ceil(steps / rounds)``); ``warmup`` the untimed
    steps before them in each round; ``profile_steps`` the steps under
    ``torch.profiler`` (CUDA only). ``budget_s`` holds for the whole run,
    tests included.
    """
    out: str = DEFAULT_OUT
    markdown: Optional[str] = None
    device: str = 'cuda'
    smoke: bool = False
    models: Sequence[str] = MODELS
    memory_models: Sequence[str] = MEMORY_MODELS
    detector_models: Sequence[str] = DETECTOR_MODELS
    phases: Sequence[str] = DEFAULT_PHASES
    precisions: Sequence[str] = tuple(PRECISIONS)
    modes: Sequence[str] = MODES
    coco_shapes: Sequence[Tuple[int, int]] = COCO_SHAPES
    single_shape: Tuple[int, int] = SINGLE_SHAPE
    memory_shape: Tuple[int, int] = MEMORY_SHAPE
    rounds: int = 2
    warmup: int = 10
    steps: int = 30
    profile_steps: int = 2
    budget_s: float = DEFAULT_BUDGET_S
    case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S
    tests_timeout_s: float = DEFAULT_TESTS_TIMEOUT_S
    compile_backend: Optional[str] = None
    compile_mode: Optional[str] = None
    amp_dtype: str = 'float16'
    peers: str = 'auto'
    detector: str = 'auto'
    threads: int = 1
    tests: Sequence[str] = CUDA_TESTS
    command: Optional[str] = None

    def __post_init__(self):
        if self.smoke:  # tiny inputs, unless others are given
            if tuple(map(tuple, self.coco_shapes)) == COCO_SHAPES:
                self.coco_shapes = SMOKE_SHAPES['coco']
            if tuple(self.single_shape) == SINGLE_SHAPE:
                self.single_shape, = SMOKE_SHAPES['single']
            if tuple(self.memory_shape) == MEMORY_SHAPE:
                self.memory_shape, = SMOKE_SHAPES['memory']
        for name in ('rounds', 'steps', 'threads'):
            check_positive_int(name, getattr(self, name))
        for name in ('warmup', 'profile_steps'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f'{name}={value!r} is invalid; expected an integer '
                                 '>= 0.')
        for name in ('budget_s', 'case_timeout_s', 'compile_timeout_s',
                     'tests_timeout_s'):
            _check_non_negative(name, getattr(self, name))
        check_lists((('model', self.models, MODELS),
                     ('memory model', self.memory_models, MODELS),
                     ('detector model', self.detector_models, MODELS),
                     ('phase', self.phases, PHASES),
                     ('precision', self.precisions, PRECISIONS),
                     ('mode', self.modes, MODES),
                     ('peers', [self.peers], PEER_CHOICES),
                     ('detector', [self.detector], DETECTOR_CHOICES),
                     ('amp_dtype', [self.amp_dtype], AMP_DTYPES)),
                    may_be_empty=('memory model', 'detector model'))
        if not self.coco_shapes:
            raise ValueError('coco_shapes is empty; expected one or more HxW.')
        fill_output_defaults(self)

    def inputs(self) -> Dict[str, InputSpec]:
        """The inputs by phase input name."""
        coco = tuple(tuple(shape) for shape in self.coco_shapes)
        return dict(coco=InputSpec(f'coco-b{len(coco)}', coco),
                    single=InputSpec('single-b1', (tuple(self.single_shape), )),
                    memory=InputSpec('memory-b1', (tuple(self.memory_shape), )))

    def protocol(self, phase: Phase, device_type: str) -> Dict:
        """``rounds``, ``warmup``, ``steps`` (per round), ``profile_steps``
        and ``regions`` (profile the regions) of ``phase``."""
        per_round = math.ceil(self.steps / self.rounds)
        profile_steps = self.profile_steps if device_type == 'cuda' else 0
        if phase.protocol in SHORT_PROTOCOLS:
            warmup, steps = SHORT_PROTOCOLS[phase.protocol]
            return dict(rounds=1, warmup=min(warmup, self.warmup),
                        steps=min(steps, per_round), profile_steps=0,
                        regions=phase.protocol == 'regions')
        return dict(rounds=self.rounds, warmup=self.warmup, steps=per_round,
                    profile_steps=profile_steps, regions=False)


@dataclasses.dataclass(frozen=True)
class Case:
    """One process: a model in one phase and round, its settings in order.

    ``settings`` are ``(mode, precision)`` pairs; ``backbone`` the name of
    :data:`~mmsoft_analysis.gpu_backbones.BACKBONES` the model resolved to;
    ``detector`` the Mask R-CNN's kind in the detector phase.
    """
    phase: str
    model: str
    backbone: str
    round: int
    input: InputSpec
    settings: Tuple[Tuple[str, str], ...]
    compiled: bool = False
    detector: Optional[str] = None

    def label(self) -> str:
        """The model as the tables name it, e.g. ``'Swin-T (timm)'``."""
        source = source_of(self.backbone)
        name = LABELS[self.model]
        return name if source == 'mmsoft' else f'{name} ({source})'

    def record(self, mode: str, precision: str, status: str, **fields) -> Dict:
        """A result record of one setting (see the module's fields)."""
        record = dict(
            phase=self.phase, model=self.model, backbone=self.backbone,
            label=self.label(), source=source_of(self.backbone),
            detector=self.detector, compiled=self.compiled, input=self.input.name,
            input_desc=self.input.describe(),
            shapes=[list(s) for s in self.input.shapes],
            canvas=list(self.input.canvas), batch=self.input.batch,
            valid_regions=self.backbone in MMSOFT_BACKBONES, precision=precision,
            mode=mode, round=self.round, status=status, error=None, note=None,
            warmup=None, steps=None, timer=None, times_ms=None, host_ms=None,
            compile_s=None, kernels=None, copies=None, launch_calls=None,
            busy_ms=None, profiled_steps=None, profiled_ms=None,
            max_memory_allocated_mib=None, max_memory_reserved_mib=None,
            allocated_before_mib=None, params_m=None, regions=None,
            matmul_tflop_per_s=None)
        record.update(fields)
        return record

    def records(self, status: str, **fields) -> List[Dict]:
        """One record per setting, all with ``status``."""
        return [self.record(mode, precision, status, **fields)
                for mode, precision in self.settings]

    def request(self) -> Dict:
        """The case as JSON for its worker."""
        fields = dataclasses.asdict(self)
        fields['input'] = dict(name=self.input.name,
                               shapes=[list(s) for s in self.input.shapes])
        return fields

    @classmethod
    def from_request(cls, fields: Dict) -> 'Case':
        spec = InputSpec(fields['input']['name'],
                         tuple(tuple(s) for s in fields['input']['shapes']))
        return cls(**dict(fields, input=spec,
                          settings=tuple(tuple(s) for s in fields['settings'])))


def resolve_backbone(model: str, peers: str) -> str:
    """The backbone ``model`` is built as: mmdet's Swin-T and PVTv2-b2 where
    ``peers`` is ``'mmdet'``, or ``'auto'`` and mmdet imports; else timm's
    (and mmsoft's own)."""
    mmdet_name = MMDET_PEERS.get(model)
    if mmdet_name is None or peers == 'timm':
        return model
    if peers == 'mmdet' or unavailable_reason(mmdet_name) is None:
        return mmdet_name
    return model


def make_cases(settings: BenchmarkSettings, phase_name: str,
               device_type: str = 'cuda', detector: Optional[str] = None
               ) -> List[Case]:
    """The cases of one phase, in the order they run: round after round,
    each model in turn, the order reversed in every other round. The
    settings of a case: training first, float32 first."""
    phase = PHASES[phase_name]
    if phase.protocol == 'tests':
        return []
    chosen = getattr(settings, phase.models)
    models = [m for m in dict.fromkeys(chosen) if m not in phase.without
              and (not phase.within or m in phase.within)]
    modes = [mode for mode in phase.modes if mode in settings.modes]
    pairs = tuple((mode, precision) for mode in modes
                  for precision in settings.precisions)
    if not pairs or not models:
        return []
    spec = settings.inputs()[phase.input]
    backbones = {model: resolve_backbone(model, settings.peers) for model in models}
    cases = []
    for round_index in range(settings.protocol(phase, device_type)['rounds']):
        order = models if round_index % 2 == 0 else models[::-1]
        cases += [Case(phase.name, model, backbones[model], round_index, spec, pairs,
                       compiled=phase.compiled,
                       detector=detector if phase.detector else None)
                  for model in order]
    return cases


# --- The worker: one case in this process
def _build(case: Case, device: torch.device, request: Dict):
    """(module run, loss(module), predict(module), module whose regions
    are profiled)."""
    spec = case.input
    if case.detector is not None:
        detector, loss, predict = build_detector(
            case.detector, case.model, case.backbone, spec, device,
            light_heads=request['smoke'])
        return detector, loss, predict, detector
    maps = build_maps(case.backbone).to(device)
    maps.valid_shapes = list(spec.shapes) if maps.takes_valid_shapes else None
    images = spec.images(device)  # (B, 3, H, W)
    module = maps
    if case.compiled:
        module = torch.compile(maps, backend=request['compile_backend'],
                               mode=request['compile_mode'])
    return module, maps_loss(images), lambda model: model(images), maps


def _measure_setting(case: Case, mode: str, precision: str, built, device,
                     protocol: Dict, request: Dict) -> Dict:
    """The measured fields of one setting."""
    module, loss, predict, regions_root = built
    dtype = autocast_dtype(precision, request['amp_dtype'])
    if mode == 'train':
        step, close = training_step(module, loss, dtype, device)
    else:
        step, close = inference_step(module, predict, dtype, device)
    fields = dict(warmup=protocol['warmup'], steps=protocol['steps'])
    try:
        if case.compiled:
            fields['compile_s'] = seconds_of(step, device)  # compiles
        time_steps(step, device, protocol['warmup'], 0)
        fields['allocated_before_mib'] = reset_memory(device)
        fields.update(time_steps(step, device, 0, protocol['steps']))
        fields.update(memory_fields(device))
        if protocol['profile_steps'] and case.round == 0:  # counts do not vary
            fields.update(profile_activity(step, device, protocol['profile_steps']))
        if protocol['regions']:
            fields.update(region_profile(regions_root, step, device))
            fields['matmul_tflop_per_s'] = request.get('matmul_tflop_per_s')
    finally:
        close()
    return fields


def run_case(case: Case, request: Dict,
             emit: Callable[[Dict], None] = lambda record: None) -> List[Dict]:
    """Builds and measures ``case`` in this process, one record per setting,
    each passed to ``emit`` as soon as it is made. A failing setting (out
    of memory, say) is recorded and the next one runs."""
    device = torch.device(request['device'])
    if device.type == 'cpu':
        torch.set_num_threads(request['threads'])
    records = []

    def add(record: Dict) -> None:
        records.append(record)
        emit(record)

    protocol = request['protocol']
    try:
        built = _build(case, device, request)
    except Exception as error:
        for record in case.records('error',
                                   error=f'build failed: {describe_error(error)}'):
            add(record)
        return records
    params_m = sum(p.numel() for p in built[0].parameters()) / 1e6
    if protocol['regions']:
        from .measure import matmul_throughput
        request['matmul_tflop_per_s'] = 2 * matmul_throughput(device=device) / 1e12
    for mode, precision in case.settings:
        try:
            free_memory(device)
            fields = _measure_setting(case, mode, precision, built, device, protocol,
                                      request)
            add(case.record(mode, precision, 'ok', params_m=params_m, **fields))
        except Exception as error:  # an OOM or a failure must not stop the rest
            add(case.record(mode, precision, 'error', params_m=params_m,
                            error=describe_error(error)))
        finally:
            free_memory(device)
    return records


def _worker_main(text: str) -> None:
    """Child process of :func:`measure_in_subprocess`: one ``RESULT <json>``
    line per record, printed as it is made."""
    request = json.loads(text)
    case = Case.from_request(request['case'])
    run_case(case, request, lambda record: print('RESULT ' + json.dumps(record),
                                                 flush=True))


def measure_in_subprocess(case: Case, request: Dict, timeout_s: float,
                          budget_bound: bool) -> List[Dict]:
    """Runs ``case`` in a fresh process killed after ``timeout_s``; the
    settings it did not report are errors (it died, or its hard limit came)
    or, where the limit was what was left of the budget, skipped."""
    child = run_child(worker_command('gpu_benchmark',
                                     json.dumps(dict(request, case=case.request()))),
                      timeout_s)
    records = child.results
    reported = {(r['mode'], r['precision']) for r in records}
    for mode, precision in case.settings:
        if (mode, precision) in reported:
            continue
        if child.timed_out and budget_bound:
            records.append(case.record(mode, precision, 'skipped',
                                       note='the budget ran out during its case'))
        elif child.timed_out:
            records.append(case.record(mode, precision, 'error',
                                       error=f'timed out after {timeout_s:.0f} s '
                                       '(the hard limit of a case)'))
        else:
            records.append(case.record(
                mode, precision, 'error',
                error=f"the case's process died: {child.last_error_line()}"[:300]))
    return records


# --- The run
def _git(*args: str) -> Optional[str]:
    try:
        done = subprocess.run(['git', '-C', str(REPO), *args], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> Optional[str]:
    """The checkout's commit, ``+ uncommitted changes`` when its tracked
    files differ; ``MMSOFT_COMMIT`` where the copy has no git history (a
    device machine's copy of the working tree)."""
    if os.environ.get('MMSOFT_COMMIT'):
        return os.environ['MMSOFT_COMMIT']
    head = _git('rev-parse', '--short', 'HEAD')
    if head and _git('status', '--porcelain', '--untracked-files=no'):
        head += ' + uncommitted changes'
    return head


def nvidia_smi() -> Optional[str]:
    """The GPU's driver, clocks and power limit as ``nvidia-smi`` gives
    them, or None."""
    fields = 'driver_version,clocks.max.sm,clocks.max.mem,power.limit'
    try:
        done = subprocess.run(['nvidia-smi', f'--query-gpu={fields}',
                               '--format=csv,noheader'], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    values = done.stdout.strip().splitlines()[0].split(', ')
    names = ('driver', 'max SM clock', 'max memory clock', 'power limit')
    return ', '.join(f'{name} {value}' for name, value in zip(names, values))


def write_results(settings: BenchmarkSettings, data: Dict) -> None:
    """Gathers the rows, ratios, targets and counts, and writes the JSON and
    the Markdown."""
    data['rows'] = aggregate(data['records'])
    data['ratios'] = ratio_rows(data['rows'])
    data['targets'] = evaluate_targets(data['rows'])
    data['summary'] = summarise(data['records'])
    write_json(settings.out, data)
    _write_atomically(settings.markdown, format_markdown(data))


def _meta(settings: BenchmarkSettings, device: torch.device) -> Dict:
    meta = environment(device)
    timing = settings.protocol(PHASES['eager'], device.type)
    meta.update(
        command=settings.command, commit=commit(),
        nvidia_smi=nvidia_smi() if device.type == 'cuda' else None,
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        smoke=settings.smoke, budget_s=settings.budget_s, phases=list(settings.phases),
        models=list(settings.models), precisions=list(settings.precisions),
        compile_backend=settings.compile_backend, compile_mode=settings.compile_mode,
        protocol=dict(rounds=timing['rounds'], warmup=timing['warmup'],
                      steps_per_round=timing['steps'],
                      steps=timing['steps'] * timing['rounds'],
                      profile_steps=timing['profile_steps'],
                      amp_dtype=settings.amp_dtype,
                      timer='CUDA events' if device.type == 'cuda' else 'wall clock',
                      short_protocols={k: dict(warmup=min(w, settings.warmup),
                                               steps=s)
                                       for k, (w, s) in SHORT_PROTOCOLS.items()},
                      meets_protocol_minimum=(timing['warmup'] >= 10 and
                                           timing['steps'] * timing['rounds'] >= 30)),
        inputs={name: spec.describe() for name, spec in settings.inputs().items()})
    if device.type == 'cpu':
        meta['device_name'] = meta['host_cpu']
    timm_peers = [model for model in MMDET_PEERS
                  if resolve_backbone(model, settings.peers) == model]
    if timm_peers:
        why = ('--peers timm' if settings.peers == 'timm' else
               import_problem(('mmdet.models.backbones', )) or 'mmdet is not usable')
        meta['peers_note'] = (f"{', '.join(LABELS[m] for m in timm_peers)}: timm's "
                              f'here, not mmdet\'s ({why}).')
    return meta


def require_benchmark_device(device: str) -> torch.device:
    """The device to measure on; a RuntimeError naming what is missing, and
    the CPU smoke mode, where CUDA is asked for and there is none."""
    return require_device(device, 'the GPU benchmark',
                          f'its CPU smoke mode: {CPU_SMOKE_COMMAND}')


def run_benchmark(settings: BenchmarkSettings,
                  log: Callable[[str], None] = print,
                  clock: Callable[[], float] = time.monotonic) -> Dict:
    """Runs the phases of ``settings`` in order within its budget, writing
    the results after every record.

    Returns:
        dict: ``meta``, ``tests``, ``phases`` (seconds and cases of each),
        ``records``, and the ``rows``, ``ratios``, ``targets`` and
        ``summary`` made of them.

    Raises:
        RuntimeError: When ``settings.device`` is CUDA and there is none.
    """
    device = require_benchmark_device(settings.device)
    start = clock()
    data = dict(meta=_meta(settings, device), tests=dict(ran=False), phases={},
                records=[])
    detector, reason = (choose_detector(settings.detector)
                        if any(PHASES[name].detector for name in settings.phases)
                        else (None, ''))
    data['meta'].update(detector=detector, detector_reason=reason)
    write_results(settings, data)
    request = dict(device=str(device), threads=settings.threads,
                   compile_backend=settings.compile_backend,
                   compile_mode=settings.compile_mode, amp_dtype=settings.amp_dtype,
                   smoke=settings.smoke)

    def add(record: Dict) -> None:
        data['records'].append(record)
        write_results(settings, data)
        outcome = (f"{statistics_text(record)}" if record['status'] == 'ok' else
                   f"{record['status']}: {record['error'] or record['note']}")
        log(f"[{len(data['records'])}] {record['phase']} {record['label']} "
            f"{record['precision']} {record['mode']} round {record['round'] + 1}: "
            f'{outcome}')

    for name in dict.fromkeys(settings.phases):
        phase_start = clock()
        phase = PHASES[name]
        cases = make_cases(settings, name, device.type, detector)
        what = ' '.join(settings.tests) if phase.protocol == 'tests' else \
            f'{len(cases)} case(s)'
        log(f'phase {name}: {what}; {settings.budget_s - (phase_start - start):.0f} s '
            'of the budget left')
        if phase.protocol == 'tests':
            data['tests'] = _run_tests(settings, settings.budget_s - (clock() - start))
            log(describe_tests(data['tests']))
        for case in cases:
            left = settings.budget_s - (clock() - start)
            if phase.detector and detector is None:
                problem = f'no Mask R-CNN can be built here: {reason}'
            elif detector == 'mmdet' and phase.detector:
                problem = None  # the configs build their backbones
            else:
                problem = unavailable_reason(case.backbone)
            if problem is not None:
                records = case.records('skipped', note=problem)
            elif left < MIN_CASE_S:
                records = case.records('skipped', note='the budget was spent')
            else:
                limit = (settings.compile_timeout_s if case.compiled
                         else settings.case_timeout_s)
                protocol = settings.protocol(phase, device.type)
                records = measure_in_subprocess(case, dict(request, protocol=protocol),
                                                min(limit, left), left <= limit)
            for record in records:
                add(record)
        data['phases'][name] = dict(seconds=clock() - phase_start, cases=len(cases))
        write_results(settings, data)
    data['meta']['seconds'] = clock() - start
    write_results(settings, data)
    return data


def statistics_text(record: Dict) -> str:
    """A measured record in a few words."""
    text = f"{statistics.median(record['times_ms']):.1f} ms"
    if record.get('kernels') is not None:
        text += f", {record['kernels']:.0f} kernels, busy {record['busy_ms']:.1f} ms"
    if record.get('max_memory_allocated_mib') is not None:
        text += f", {record['max_memory_allocated_mib']:.0f} MiB"
    if record.get('compile_s') is not None:
        text += f", compiled in {record['compile_s']:.0f} s"
    return text


def _run_tests(settings: BenchmarkSettings, left_s: float) -> Dict:
    """The CUDA tests (pytest in a child process) within what is left."""
    import importlib.util
    if importlib.util.find_spec('pytest') is None:
        return dict(ran=False, error='pytest is not installed here')
    if left_s < MIN_CASE_S:
        return dict(ran=False, error='the budget was spent')
    return run_tests(settings.tests, min(settings.tests_timeout_s, left_s))


def passed(data: Dict) -> bool:
    """Whether no measurement failed and the tests, where they ran, passed.
    Missed targets and skipped cases do not fail the run."""
    tests = data['tests']
    return (data['summary'].get('error', 0) == 0
            and (not tests.get('ran') or tests.get('returncode') == 0))


def command_line(argv: Sequence[str]) -> str:
    """The command as typed, for the record."""
    return 'python tools/analysis/gpu_benchmark.py ' + shlex.join(list(argv))


if __name__ == '__main__':
    _worker_main(sys.argv[1])
