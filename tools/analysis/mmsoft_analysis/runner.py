"""The benchmark's runner: one fresh process per measurement, in turn, within
a time budget, the report written after every record.
"""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import ANALYSIS_DIR, REPO
from .models import parse_spec, unavailable
from .report import write_report

MODES = ('train', 'inference')
PRECISIONS = ('float32', 'amp')
#: A case is not started with less than this left of the budget.
MIN_CASE_S = 10.


@dataclasses.dataclass
class Settings:
    """What :func:`run_benchmark` measures (``tools/analysis/benchmark.py
    --help`` says what each does)."""
    models: Sequence[str]
    inputs: Sequence[Sequence[Tuple[int, int]]]
    out_dir: str = 'work_dirs/benchmark'
    device: str = 'cpu'
    detector: bool = False
    modes: Sequence[str] = MODES
    precisions: Sequence[str] = ('float32', )
    amp_dtype: str = 'float16'
    compile: Optional[str] = None
    compiled_only: bool = False
    optimizer: str = 'none'
    pad: int = 1
    warmup: int = 1
    steps: int = 3
    rounds: int = 1
    threads: int = 1
    memory: bool = False
    live_memory: bool = False
    kernels: int = 0
    host_sync: bool = False
    flops: bool = False
    regions: bool = False
    saved_tensors: bool = False
    capacity: Optional[Tuple[int, int]] = None
    memory_limit_gb: float = 16.
    max_batch: int = 512
    tests: Sequence[str] = ()
    budget_s: float = 1e9
    case_timeout_s: float = 900.
    tests_timeout_s: float = 150.
    command: str = ''

    def __post_init__(self):
        for spec in self.models:
            parse_spec(spec)  # raises on an unknown name
        for name, choices in (('modes', MODES), ('precisions', PRECISIONS)):
            values = list(getattr(self, name))
            if not values or not set(values) <= set(choices):
                raise ValueError(f'{name}={values} are invalid; expected one or '
                                 f'more of {list(choices)}.')
        for name in ('steps', 'rounds', 'threads', 'pad'):
            value = getattr(self, name)
            least = int(name != 'steps' or not self.live_memory)
            if not isinstance(value, int) or value < least:
                raise ValueError(f'{name}={value!r} is invalid; expected an integer '
                                 f'>= {least}.')
        if not self.models or not self.inputs:
            raise ValueError('no model or no input given.')


def describe_input(shapes: Sequence[Tuple[int, int]]) -> str:
    """E.g. ``'800x1333'`` or ``'800x1199+800x1067'``."""
    return '+'.join(f'{h}x{w}' for h, w in shapes)


def make_cases(settings: Settings) -> List[Dict]:
    """Every case, in the order run: eager, then compiled; each input; each
    round, the models' order reversed every other round; then the live-memory
    processes and the capacity searches."""
    common = {key: getattr(settings, key) for key in (
        'device', 'amp_dtype', 'optimizer', 'pad', 'warmup', 'steps', 'threads',
        'kernels', 'host_sync', 'flops', 'regions', 'saved_tensors',
        'memory_limit_gb', 'max_batch')}
    common.update(detector=settings.detector, memory=settings.memory, live=False,
                  capacity=False, settings=[(m, p) for m in settings.modes
                                            for p in settings.precisions])
    specs = [parse_spec(text) for text in settings.models]
    compiles = ([None] * (not settings.compiled_only) +
                [settings.compile] * (settings.compile is not None))
    cases = []
    for backend in compiles:
        for shapes in settings.inputs:
            for index in range(settings.rounds):
                order = specs if index % 2 == 0 else specs[::-1]
                cases += [dict(common, spec=text_of(spec), label=spec.label,
                               root=root_of(spec), shapes=shapes,
                               input=describe_input(shapes), compile=backend,
                               round=index) for spec in order]
    eager = [case for case in cases if case['round'] == 0 and not case['compile']]
    if settings.steps == 0:  # the live peaks alone
        cases = []
    if settings.live_memory and settings.device == 'cpu':
        cases += [dict(case, live=True, flops=False, regions=False) for case in eager]
    if settings.capacity:
        cases += [dict(case, capacity=True, flops=False, shapes=[settings.capacity],
                       input=describe_input([settings.capacity]),
                       settings=[('capacity', 'float32')])
                  for case in eager if case['shapes'] == settings.inputs[0]]
    return cases


def root_of(spec) -> str:
    """A spec's ``root=`` option as an absolute path, '' for this checkout."""
    root = spec.options.get('root')
    return str(Path(root).resolve()) if root else ''


def text_of(spec) -> str:
    """A spec as ``NAME:key=value,...``, without its label."""
    options = ','.join(f'{k}={v!r}' for k, v in spec.options.items())
    return spec.name + (f':{options}' if options else '')


def run_case(case: Dict, timeout_s: float) -> List[Dict]:
    """Runs ``case`` in a fresh process (its own process group), killed with
    its children after ``timeout_s``; the settings it did not report are
    errors saying why."""
    # tools/analysis/ first on PYTHONPATH (a case's root goes first on the
    # measuring process's sys.path, before its working directory: .measure)
    paths = filter(None, (str(ANALYSIS_DIR), os.environ.get('PYTHONPATH')))
    process = subprocess.Popen(
        [sys.executable, '-m', 'mmsoft_analysis.measure', json.dumps(case)], cwd=REPO,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        failure = 'its process died: ' + (stderr.strip().splitlines() or
                                          [f'exit status {process.returncode}'])[-1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # and a compiler's workers
        stdout, _ = process.communicate()
        failure = f'timed out after {timeout_s:.0f} s'
    records = [json.loads(line[7:]) for line in stdout.splitlines()
               if line.startswith('RESULT ')]
    done = {(r['mode'], r['precision']) for r in records}
    return records + [skipped(case, mode, precision, 'error', error=failure[:300])
                      for mode, precision in case['settings']
                      if (mode, precision) not in done]


def skipped(case: Dict, mode: str, precision: str, status: str = 'skipped',
            **fields) -> Dict:
    """The record of one setting of ``case``: its fields and ``fields``."""
    return dict(label=case['label'], spec=case['spec'], input=case['input'],
                detector=case['detector'], compiled=case['compile'],
                round=case['round'], mode=mode, precision=precision, status=status,
                **fields)


def run_tests(paths: Sequence[str], timeout_s: float) -> Dict:
    """``pytest`` on ``paths`` in a fresh process: ``returncode``,
    ``seconds``, the outcome counts of its JUnit report and ``failed_tests``."""
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, 'junit.xml')
        command = [sys.executable, '-m', 'pytest', *paths, '-q', '-p',
                   'no:cacheprovider', f'--junitxml={report}']
        began = time.monotonic()
        outcome = dict(ran=True, command=' '.join(command[:-1]))
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout_s)
            outcome.update(returncode=done.returncode, output_tail='\n'.join(
                (done.stdout + done.stderr).strip().splitlines()[-30:]))
        except subprocess.TimeoutExpired:
            outcome.update(returncode=None, error=f'timed out after {timeout_s:g} s')
        outcome['seconds'] = time.monotonic() - began
        if not os.path.exists(report):
            return dict(outcome, error=outcome.get('error', 'pytest wrote no report'))
        root = ElementTree.parse(report).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))
    for key, attribute in (('total', 'tests'), ('failed', 'failures'),
                           ('errors', 'errors'), ('skipped', 'skipped')):
        outcome[key] = sum(int(suite.get(attribute, 0)) for suite in suites)
    outcome['passed'] = (outcome['total'] - outcome['failed'] - outcome['errors']
                         - outcome['skipped'])
    outcome['failed_tests'] = [f"{c.get('classname')}::{c.get('name')}"
                               for c in root.iter('testcase')
                               if c.find('failure') is not None
                               or c.find('error') is not None]
    return outcome


def environment(settings: Settings) -> Dict:
    """The device, the software and the commit measured."""
    import platform

    import torch
    cuda = settings.device.startswith('cuda')
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(
            f'device={settings.device!r} needs a CUDA device, but torch '
            f'{torch.__version__} sees none here; run on a GPU, or with --device cpu '
            '(the CPU smoke mode).')
    try:
        with open('/proc/cpuinfo') as cpuinfo:
            cpu = next(line.split(':', 1)[1].strip() for line in cpuinfo
                       if line.startswith('model name'))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    commit = os.environ.get('MMSOFT_COMMIT') or subprocess.run(
        ['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'], capture_output=True,
        text=True).stdout.strip() or None
    return dict(device=settings.device, torch=torch.__version__,
                cuda=torch.version.cuda,
                device_name=torch.cuda.get_device_name(settings.device) if cuda
                else f'{cpu}, {os.cpu_count()} cores',
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                python=platform.python_version(), commit=commit,
                command=settings.command, date=time.strftime('%Y-%m-%d %H:%M'),
                settings={k: v for k, v in dataclasses.asdict(settings).items()
                          if k not in ('command', 'out_dir')})


def run_benchmark(settings: Settings, log: Callable[[str], None] = print,
                  run: Callable[[Dict, float], List[Dict]] = run_case,
                  clock: Callable[[], float] = time.monotonic) -> Dict:
    """Runs the tests (where given) and the cases within ``budget_s``,
    writing the report after every record; ``run`` measures one case.
    Returns ``meta``, ``tests``, ``records`` and what the report makes of
    them (``rows``, ``targets``)."""
    start = clock()
    data = dict(meta=environment(settings), tests=dict(ran=False), records=[])
    write_report(data, settings.out_dir)
    if settings.tests:
        log(f'running pytest {" ".join(settings.tests)} ...')
        data['tests'] = run_tests(settings.tests, min(settings.tests_timeout_s,
                                                      settings.budget_s))
        write_report(data, settings.out_dir)
    for case in make_cases(settings):
        left = settings.budget_s - (clock() - start)
        problem = unavailable(parse_spec(case['spec']).name, case['detector']) \
            if not case['spec'].endswith('.py') else None
        if problem or left < MIN_CASE_S:
            records = [skipped(case, mode, precision,
                               note=problem or 'the budget was spent')
                       for mode, precision in case['settings']]
        else:
            records = run(case, min(settings.case_timeout_s, left))
        for record in records:
            record['live'] = case['live']
            data['records'].append(record)
            log(f"[{len(data['records'])}] {record['label']} {record['input']} "
                f"{record['mode']} {record['precision']}"
                f"{' compiled' if record['compiled'] else ''}"
                f"{' (live memory)' if case['live'] else ''}: {outcome(record)}")
        write_report(data, settings.out_dir)
    data['meta']['seconds'] = clock() - start
    return write_report(data, settings.out_dir)


def outcome(record: Dict) -> str:
    """A record in a few words."""
    if record['status'] != 'ok':
        return f"{record['status']}: {record.get('error') or record.get('note')}"
    parts = [f'{key} {record[key]:.0f} MiB'
             for key in ('peak_mib', 'live_peak_mib', 'max_allocated_mib')
             if record.get(key) is not None]
    if record.get('times_ms'):
        times = sorted(record['times_ms'])
        parts.insert(0, f'{times[len(times) // 2]:.1f} ms')
    if record.get('largest_batch') is not None:
        parts.append(f"largest batch {record['largest_batch']}")
    return ', '.join(parts) or 'ok'


def passed(data: Dict) -> bool:
    """Whether no measurement failed and the tests, where they ran, passed."""
    tests = data['tests']
    return (all(r['status'] != 'error' for r in data['records'])
            and (not tests.get('ran') or tests.get('returncode') == 0))
