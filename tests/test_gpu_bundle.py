"""The offline GPU bundle (``tools/gpu_node.sh pack check``) and its run on the
node (``run check``), without a GPU and without downloading wheels.

- requirements/gpu-bundle.txt resolves to wheels for CPython 3.12 on
  manylinux_2_28 x86-64 (pip's dry run: metadata only), each pinned in
  requirements/locks/gpu-bundle.txt; skipped when no package index answers.
- The runner stops at once, exit status 3, naming the reason, when the
  python has no torch, a torch without CUDA, or no GPU visible; it refuses
  a bundle that holds a torch wheel.
"""
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

# The GPU node's scripts and locks, which no torch release here changes
# (setup.cfg's markers).
pytestmark = pytest.mark.scripts

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / 'requirements' / 'gpu-bundle.txt'
LOCK = REPO / 'requirements' / 'locks' / 'gpu-bundle.txt'
OFFLINE = [str(REPO / 'tools' / 'gpu_node.sh'), 'run', 'check']
PYTHON_VERSION = (3, 12)
PLATFORM = 'manylinux_2_28_x86_64'
#: Every platform tag pip accepts for --platform manylinux_2_28_x86_64.
PLATFORMS = [f'manylinux_2_{minor}_x86_64' for minor in range(28, 4, -1)] + [
    'manylinux2014_x86_64', 'manylinux2010_x86_64', 'manylinux1_x86_64']
SUPPORTED_TAGS = (set(cpython_tags(PYTHON_VERSION, abis=['cp312'], platforms=PLATFORMS))
                  | set(compatible_tags(PYTHON_VERSION, 'cp312', PLATFORMS)))
#: Signs in pip's output that the package index could not be reached.
UNREACHABLE = re.compile(
    r'NewConnectionError|Name or service not known|Temporary failure in name '
    r'resolution|Network is unreachable|Max retries exceeded|Connection refused|'
    r'ConnectTimeout|Read timed out|ProxyError|SSLError|Could not fetch URL')
SECONDS = 30


def requirement_names(path: Path) -> set:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line and not line.startswith('-'):
            names.add(canonicalize_name(Requirement(line).name))
    return names


def locked_pins(path: Path) -> dict:
    """``name: (version, hashes)`` of a lock written by uv with hashes."""
    text = re.sub(r'\\\n\s*', ' ', path.read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split('#', 1)[0].strip()
        if line:
            name, version = line.split()[0].split('==')
            hashes = re.findall(r'--hash=sha256:\w+', line)
            pins[canonicalize_name(name)] = (version, hashes)
    return pins


def test_lock_pins_every_requirement_with_hashes():
    assert 'target: CPython 3.12, manylinux_2_28_x86_64' in LOCK.read_text()
    pins = locked_pins(LOCK)
    assert requirement_names(REQUIREMENTS) <= set(pins)
    for name, (version, hashes) in pins.items():
        assert version and hashes, f'{name} is not pinned with hashes in {LOCK}'


def test_bundle_resolves_for_cpython_312(tmp_path):
    """pip's dry run for the node's target: a wheel for each package, no
    download of the wheels themselves (their metadata only)."""
    command = [sys.executable, '-m', 'pip', 'install', '--dry-run',
               '--ignore-installed', '--disable-pip-version-check', '--quiet',
               '--timeout', '10', '--retries', '1',
               '--report', str(tmp_path / 'report.json'),
               '--python-version', '.'.join(map(str, PYTHON_VERSION)),
               '--implementation', 'cp', '--only-binary=:all:',
               '--platform', PLATFORM, '--target', str(tmp_path / 'site'),
               '-r', str(REQUIREMENTS)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip('the package index did not answer within 120 s')
    output = done.stdout + done.stderr
    if done.returncode != 0 and UNREACHABLE.search(output):
        pytest.skip('the package index cannot be reached: '
                    + UNREACHABLE.search(output).group(0))
    if done.returncode != 0 and 'no such option' in output:
        pytest.skip(f'this pip has no --dry-run/--report: {output.strip()}')
    assert done.returncode == 0, output
    report = json.loads((tmp_path / 'report.json').read_text())
    resolved = {}
    for item in report['install']:
        name = canonicalize_name(item['metadata']['name'])
        filename = item['download_info']['url'].rsplit('/', 1)[-1].split('#')[0]
        assert filename.endswith('.whl'), f'{name} resolved to {filename}, not a wheel'
        tags = parse_wheel_filename(filename)[3]
        assert tags & SUPPORTED_TAGS, \
            f'{filename} does not run on CPython 3.12, {PLATFORM}'
        resolved[name] = item['metadata']['version']
    assert requirement_names(REQUIREMENTS) <= set(resolved)
    # The lock holds the same packages (their versions may have moved on).
    assert set(resolved) == set(locked_pins(LOCK)), \
        f'{LOCK} is out of date: run make gpu-bundle-lock'


def run_offline(tmp_path, python, *args, extra_env=None, timeout=SECONDS):
    env = {k: v for k, v in os.environ.items()
           if k not in ('MMSOFT_GPU_CHECK_DEVICE', 'PYTHONPATH')}
    env.update(PYTHON=str(python), **(extra_env or {}))
    start = time.monotonic()
    done = subprocess.run(
        ['bash', *OFFLINE, str(tmp_path / 'bundle'), str(tmp_path / 'out'), *args],
        capture_output=True, text=True, env=env, timeout=timeout)
    return done, time.monotonic() - start


def fake_torch(tmp_path, cuda):
    """A folder with a stand-in ``torch`` package: a build for ``cuda``
    (None: CPU-only) that sees no device."""
    package = tmp_path / 'fake' / 'torch'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(
        "__version__ = '0.0+fake'\n"
        f'class version:\n    cuda = {cuda!r}\n    hip = None\n'
        'class cuda:\n    is_available = staticmethod(lambda: False)\n')
    return str(package.parent)


def test_refuses_this_python_without_a_gpu(tmp_path):
    torch = pytest.importorskip('torch')
    if torch.cuda.is_available():
        pytest.skip('a CUDA device is visible here')
    cpu_only = torch.version.cuda is None and \
        getattr(torch.version, 'hip', None) is None
    done, seconds = run_offline(tmp_path, sys.executable)
    assert done.returncode == 3, done.stdout + done.stderr
    reason = 'torch without CUDA' if cpu_only else 'no GPU visible'
    assert reason in done.stderr and '--allow-cpu' in done.stderr
    assert seconds < SECONDS and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('cuda, reason', [(None, 'torch without CUDA'),
                                          ('13.0', 'no GPU visible')])
def test_names_the_reason(tmp_path, cuda, reason):
    done, _ = run_offline(tmp_path, sys.executable,
                          extra_env=dict(PYTHONPATH=fake_torch(tmp_path, cuda)))
    assert done.returncode == 3 and reason in done.stderr, done.stdout + done.stderr


def test_refuses_a_python_without_torch(tmp_path):
    for python in ('/nonexistent/python3', tmp_path / 'venv' / 'bin' / 'python'):
        if 'venv' in str(python):
            subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                            str(tmp_path / 'venv')], check=True, timeout=SECONDS)
        done, seconds = run_offline(tmp_path, python)
        assert done.returncode == 3, done.stdout + done.stderr
        assert 'no torch' in done.stderr and seconds < SECONDS


@pytest.mark.parametrize('wheel, message', [
    (None, 'holds no wheels'),
    ('torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl', "the node's own is used")])
def test_refuses_a_bad_bundle(tmp_path, wheel, message):
    (tmp_path / 'bundle').mkdir()
    if wheel:
        (tmp_path / 'bundle' / wheel).write_bytes(b'')
    done, _ = run_offline(tmp_path, sys.executable, '--allow-cpu',
                          extra_env=dict(PYTHONPATH=fake_torch(tmp_path, None)))
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr


@pytest.mark.torchvision  # timm, the smoke mode's peer
def test_cpu_smoke_run_installs_the_bundle_and_runs_the_benchmark(tmp_path):
    """``run check --allow-cpu``: the bundle installed into a temporary
    folder, the CUDA tests collected (skipped without a GPU), then the
    benchmark's command end to end in its CPU smoke mode (a fresh process per
    case, the report written and printed), its report closed with the run's
    phases."""
    bundle = tmp_path / 'bundle'
    bundle.mkdir()
    with zipfile.ZipFile(bundle / 'stand_in-1.0-py3-none-any.whl', 'w') as wheel:
        wheel.writestr('stand_in.py', '')
        wheel.writestr('stand_in-1.0.dist-info/METADATA',
                       'Metadata-Version: 2.1\nName: stand-in\nVersion: 1.0\n')
        wheel.writestr('stand_in-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\n'
                       'Generator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
        wheel.writestr('stand_in-1.0.dist-info/RECORD', '')
    tests = tmp_path / 'test_node.py'
    tests.write_text('def test_node():\n    pass\n')
    done, _ = run_offline(tmp_path, sys.executable, '--allow-cpu', '--budget-s', '400',
                          '--modes', 'inference', '--steps', '1', '--warmup', '0',
                          '--tests', str(tests), timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'installed 1 wheels' in done.stdout
    data = json.loads((tmp_path / 'out' / 'results.json').read_text())
    assert (data['tests']['passed'], data['tests']['failed']) == (1, 0)
    assert [(r['label'], r['mode'], r['status']) for r in data['rows']] == [
        ('soft++-tiny', 'inference', 'ok'), ('timm-swin-t', 'inference', 'ok')]
    assert all(r['median_ms'] > 0 for r in data['rows'])
    assert '| timm-swin-t | inference | float32 |' in done.stdout
    text = (tmp_path / 'out' / 'results.md').read_text()
    assert re.search(r'Offline run: exit status 0; total \d+ s of a 400 s budget\. '
                     r'Phases: device \d+ s, install \d+ s, benchmark \d+ s\.', text)
