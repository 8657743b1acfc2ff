"""The installers: locks that pin every requirement, the mmcv wheel cache's
key, and errors a person can act on.

The installs themselves run on every CI run (``make test`` starts with
them, the steps before mmcv's compile with an empty pip cache); these tests
check what those runs cannot show: that the locks match the human-edited
requirements, that the wheel cache's key moves with what changes the wheel,
and what the installer says when a step fails.
"""
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace
from typing import Dict, List

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.scripts

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
REQUIREMENTS = osp.join(REPO, 'requirements')
#: Each lock and the human-edited files it is written from (tools/install.sh lock).
LOCKS = {
    'stack.txt': ['pip.txt', 'build.txt', 'runtime.txt', 'tests.txt', 'deploy.txt',
                  'mim.txt'],
    'mmcv.txt': ['mmcv.txt'],
    'floor.txt': ['pip.txt', 'floor.txt'],
    'floor-nodeps.txt': ['floor-nodeps.txt'],
    'newest.txt': ['pip.txt', 'newest.txt'],
}


def requirements_of(path: str) -> List[Requirement]:
    """The requirements of a human-edited file."""
    with open(path) as file:
        lines = [line.split('#')[0].strip() for line in file]
    return [Requirement(line) for line in lines if line]


def lock_entries(path: str) -> Dict[str, dict]:
    """``{name: {'version': ..., 'hashes': [...]}}`` of a lock file."""
    with open(path) as file:
        text = file.read().replace('\\\n', ' ')
    entries = {}
    for line in text.splitlines():
        match = re.match(r'^([A-Za-z0-9._-]+)==(\S+)(.*)$', line)
        if match:
            entries[canonicalize_name(match[1])] = dict(
                version=match[2], hashes=re.findall(r'--hash=sha256:[0-9a-f]{64}',
                                                    match[3]))
    return entries


@pytest.mark.parametrize('lock', list(LOCKS))
def test_lock_pins_every_requirement_with_hashes(lock):
    entries = lock_entries(osp.join(REQUIREMENTS, 'locks', lock))
    assert entries
    assert all(entry['hashes'] for entry in entries.values()), lock
    for source in LOCKS[lock]:
        for requirement in requirements_of(osp.join(REQUIREMENTS, source)):
            name = canonicalize_name(requirement.name)
            assert name in entries, f'{lock} lacks {name} ({source}): run make lock'
            assert requirement.specifier.contains(entries[name]['version'],
                                                  prereleases=True), (
                f'{lock} pins {name}=={entries[name]["version"]}, {source} asks '
                f'{requirement}: run make lock')


def test_stack_lock_leaves_mmcv_to_its_build():
    """mmcv comes from tools/build_mmcv_wheel.sh (its sdist pinned in
    locks/mmcv.txt), never from the stack's lock."""
    assert 'mmcv' not in lock_entries(osp.join(REQUIREMENTS, 'locks', 'stack.txt'))
    assert list(lock_entries(osp.join(REQUIREMENTS, 'locks', 'mmcv.txt'))) == ['mmcv']


def test_newest_lock_holds_no_openmmlab_package_and_the_newest_frameworks():
    """The newest environment is a timm / Hugging Face user's: no OpenMMLab
    package, transformers 5.x, and a torchvision beside its torch."""
    entries = lock_entries(osp.join(REQUIREMENTS, 'locks', 'newest.txt'))
    assert not {'mmengine', 'mmcv', 'mmcv-lite', 'mmdet', 'mmsegmentation',
                'mmpretrain'} & set(entries)
    assert entries['transformers']['version'].startswith('5.')
    for name in ('torch', 'torchvision', 'timm', 'segmentation-models-pytorch',
                 'pycocotools', 'scipy', 'onnxruntime', 'pytest'):
        assert name in entries, name


def test_build_tools_are_the_locked_ones():
    """The build constraints (the lock tool's isolated build) name the
    setuptools and wheel that both environments install."""
    constraints = {canonicalize_name(r.name): r for r in
                   requirements_of(osp.join(REQUIREMENTS, 'build-constraints.txt'))}
    assert set(constraints) == {'setuptools', 'wheel'}
    for lock in ('stack.txt', 'floor.txt', 'newest.txt'):
        entries = lock_entries(osp.join(REQUIREMENTS, 'locks', lock))
        for name, requirement in constraints.items():
            assert str(requirement.specifier) == f'=={entries[name]["version"]}'


def collected(*options) -> tuple:
    """pytest's collection of this file with ``options``: the process's
    result and the node ids it selected."""
    done = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q',
                           '-p', 'no:cacheprovider', 'tests/test_install.py', *options],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    return done, [line for line in done.stdout.splitlines() if '::' in line]


def test_shards_run_each_selected_test_once():
    """``make test`` runs the floor suite as two processes (``--shard 1/2`` and
    ``2/2``, tests/conftest.py), each on every other test that the markers and
    ``-k`` selected."""
    from tests.conftest import Shard
    parts = []
    for part in (1, 2):
        deselected, items = [], list(range(9))  # the selected tests, in order
        hook = SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items))
        Shard(f'{part}/2').pytest_collection_modifyitems(SimpleNamespace(hook=hook),
                                                         items)
        assert sorted(items + deselected) == list(range(9))
        parts.append(items)
    assert parts == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    with pytest.raises(pytest.UsageError, match=r'--shard 3/2: expected K/N'):
        Shard('3/2')
    # In pytest, after -k's deselection.
    done, selected = collected('-k', 'not lock')
    assert len(selected) > 2 and re.search(r'\([1-9]\d* deselected\)', done.stdout)
    assert collected('-k', 'not lock', '--shard', '2/2')[1] == selected[1::2]


# --------------------------------------------------------------------------
# The mmcv wheel cache's key
# --------------------------------------------------------------------------
def wheel_key(repo: str, **settings) -> str:
    env = {key: value for key, value in os.environ.items()
           if key not in ('CC', 'CXX', 'CFLAGS', 'CXXFLAGS', 'LDFLAGS',
                          'TORCH_CUDA_ARCH_LIST', 'FORCE_CUDA', 'CUDA_HOME',
                          'MMCV_OPS')}
    env.update(settings)
    done = subprocess.run(['bash', osp.join(repo, 'tools', 'build_mmcv_wheel.sh'),
                           'key', sys.executable], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope='module')
def repo_copy(tmp_path_factory):
    """The files the key is made of, in a scratch checkout."""
    root = tmp_path_factory.mktemp('repo')
    shutil.copytree(osp.join(REPO, 'tools'), root / 'tools',
                    ignore=shutil.ignore_patterns('__pycache__'))
    (root / 'requirements' / 'locks').mkdir(parents=True)
    shutil.copy(osp.join(REQUIREMENTS, 'locks', 'mmcv.txt'),
                root / 'requirements' / 'locks')
    return str(root)


@pytest.fixture(scope='module')
def base_key(repo_copy) -> str:
    """The key of the scratch checkout (each key imports torch: seconds)."""
    return wheel_key(repo_copy)


def test_wheel_key_names_mmcv_and_torch_and_is_stable(base_key):
    import torch
    locked = lock_entries(osp.join(REQUIREMENTS, 'locks', 'mmcv.txt'))
    version = locked['mmcv']['version']
    assert re.fullmatch(rf'mmcv-{re.escape(version)}-torch-'
                        rf'{re.escape(torch.__version__)}-[0-9a-f]{{16}}', base_key)
    # Computed again, from the checkout: the scratch copy holds all it depends on.
    assert wheel_key(REPO) == base_key


def test_wheel_key_changes_with_build_settings(repo_copy, base_key):
    changed = {wheel_key(repo_copy, **{name: value}) for name, value in [
        ('CXXFLAGS', '-O1'), ('TORCH_CUDA_ARCH_LIST', '9.0'), ('FORCE_CUDA', '1'),
        ('CXX', 'g++'), ('MMCV_OPS', 'all')]}
    assert base_key not in changed and len(changed) == 5


def test_wheel_key_changes_with_the_build_script_and_the_sdist(repo_copy, base_key,
                                                               tmp_path):
    edited = str(tmp_path / 'edited')
    shutil.copytree(repo_copy, edited)
    with open(osp.join(edited, 'tools', 'build_mmcv_wheel.sh'), 'a') as file:
        file.write('\n# another build step\n')
    assert wheel_key(edited) != base_key
    relocked = str(tmp_path / 'relocked')
    shutil.copytree(repo_copy, relocked)
    lock = osp.join(relocked, 'requirements', 'locks', 'mmcv.txt')
    with open(lock) as file:
        text = file.read()
    with open(lock, 'w') as file:
        file.write(re.sub(r'sha256:[0-9a-f]{64}', 'sha256:' + '0' * 64, text))
    assert wheel_key(relocked) != base_key


# --------------------------------------------------------------------------
# What the installer says
# --------------------------------------------------------------------------
def run_installer_function(snippet: str, tmp_path,
                           **env) -> subprocess.CompletedProcess:
    """``snippet`` in bash after sourcing tools/install.sh, with the
    logs in ``tmp_path``."""
    environment = dict(os.environ, MMSOFT_INSTALL_LOGS=str(tmp_path / 'logs'), **env)
    return subprocess.run(
        ['bash', '-c', f'set -euo pipefail; source tools/install.sh; {snippet}'],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)


def test_mmcv_units_compile_after_their_shared_header_precompiled(tmp_path):
    """The compiler of mmcv's build (``precompiling_cxx``) precompiles
    pytorch_cpp_helper.hpp once, beside it, with the first unit's flags but
    its dependency file, source and output; then it compiles each unit as
    asked."""
    common = tmp_path / 'csrc' / 'common'
    common.mkdir(parents=True)
    (common / 'pytorch_cpp_helper.hpp').write_text('')
    calls, compiler = tmp_path / 'calls', tmp_path / 'c++'
    compiler.write_text('#!/usr/bin/env bash\n'  # logs its call, makes its output
                        f'echo "$*" >> {calls}\n'
                        'for arg; do [ "$last" = -o ] && touch "$arg"; last=$arg\n'
                        'done\n')
    compiler.chmod(0o755)
    (tmp_path / 'bin').mkdir()
    subprocess.run(['bash', '-c', 'source tools/build_mmcv_wheel.sh && '
                    f'precompiling_cxx {tmp_path / "bin"}'], cwd=REPO, check=True,
                   env=dict(os.environ, CXX=str(compiler)), timeout=60)
    units = [['-MMD', '-MF', f'{name}.o.d', '-O3', f'-I{common}', '-c', '-c',
              f'{name}.cpp', '-o', f'{name}.o', '-std=c++20', '-DX=1']
             for name in ('a', 'b')]
    for unit in units:
        subprocess.run([str(tmp_path / 'bin' / 'c++'), *unit], cwd=tmp_path,
                       check=True, timeout=60)
    header = common / 'pytorch_cpp_helper.hpp'
    precompile = (f'-O3 -I{common} -std=c++20 -DX=1 -x c++-header {header} '
                  f'-o {header}.gch.part')
    assert calls.read_text().splitlines() == [precompile,
                                              *(' '.join(unit) for unit in units)]
    assert (common / 'pytorch_cpp_helper.hpp.gch').is_file()


def test_mmcv_build_keeps_the_units_of_the_ops_asked_and_binds_the_rest_to_an_error(
        tmp_path):
    """``only_ops`` removes the units of the other ops (info.cpp stays), and
    pybind.cpp binds their functions to one that raises, naming the op and
    MMCV_OPS, so that mmcv's modules still find every name."""
    csrc = tmp_path / 'pytorch'
    (csrc / 'cpu').mkdir(parents=True)
    for name in ('nms', 'roi_pool', 'info'):
        (csrc / f'{name}.cpp').write_text(
            f'Tensor {name}_op(Tensor x,\n    int y) {{\n'
            f'  return {name}_impl(x);\n}}\n')
    (csrc / 'cpu' / 'nms.cpp').write_text('')
    (csrc / 'cpu' / 'roi_pool_cpu.cpp').write_text('')
    nms_bind = ('  m.def("nms", &nms_op, "nms", py::arg("x"),\n'
                '        py::arg("y"));\n')
    (csrc / 'pybind.cpp').write_text(
        '#include <torch/extension.h>\nTensor nms_op(Tensor x, int y);\n'
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n' + nms_bind
        + '  m.def("roi_pool",\n        &roi_pool_op, "roi_pool");\n'
        '  m.def("info", &info_op, "info");\n}\n')
    subprocess.run(['bash', '-c', 'source tools/build_mmcv_wheel.sh && '
                    f'only_ops {sys.executable} {csrc} nms'], cwd=REPO, check=True,
                   timeout=60)
    assert sorted(p.relative_to(csrc).as_posix() for p in csrc.rglob('*.cpp')) == [
        'cpu/nms.cpp', 'info.cpp', 'nms.cpp', 'pybind.cpp']
    pybind = (csrc / 'pybind.cpp').read_text()
    assert nms_bind in pybind and '  m.def("info", &info_op, "info");\n' in pybind
    assert '  m.def("roi_pool", LeftOut{"roi_pool"});\n' in pybind
    assert ('"mmcv\'s op " + name + " is not compiled: this build of mmcv compiled '
            'nms (MMCV_OPS of mmsoft\'s tools/build_mmcv_wheel.sh; all: every op)"'
            in pybind)


@pytest.mark.mmcv_ops
def test_installed_mmcv_runs_the_configs_ops():
    """The stack's mmcv, built with MMCV_OPS' default, runs the ops of the
    shipped configs; an op it left out raises, naming MMCV_OPS."""
    import torch
    from mmcv.ops import DeformConv2d, RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]])
    _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    features = torch.arange(16.).reshape(1, 1, 4, 4).requires_grad_()
    roi = torch.tensor([[0., 1, 1, 2, 2]])  # its image, then x1, y1, x2, y2
    pooled = RoIAlign(1, 1.0, 1, aligned=False)(features, roi)  # the mean at (1.5, 1.5)
    pooled.sum().backward()
    assert pooled.item() == pytest.approx(7.5) and features.grad.sum().item() == 1
    left_out = 'deform_conv_forward is not compiled.*MMCV_OPS'
    with pytest.raises(RuntimeError, match=left_out):
        DeformConv2d(1, 1, 3)(features.detach(), torch.zeros(1, 18, 2, 2))


@pytest.mark.parametrize('output, hint', [
    ('WARNING: Retrying ... NewConnectionError: Temporary failure in name resolution',
     'the package registry could not be reached'),
    ('OSError: [Errno 28] No space left on device', 'the disk ran full'),
    ('ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.',
     'does not match the hash in requirements/locks/'),
    ("ModuleNotFoundError: No module named 'pkg_resources'",
     'requirements/build-constraints.txt'),
    ('ERROR: No matching distribution found for torch==2.14.1',
     'CPython 3.11 on x86-64 Linux'),
    ('cause: Hash mismatch for `torch==2.14.1`', 'does not match the hash'),
    ('cause: Because there is no version of torch==2.14.1 and you require '
     'torch==2.14.1, we can conclude that your requirements are unsatisfiable.',
     'CPython 3.11 on x86-64 Linux'),
    ('cause: error sending request for url (https://pypi.org/simple/torch/)',
     'the package registry could not be reached'),
    ('something else went wrong', 'read the log above'),
])
def test_failed_step_names_the_step_package_log_and_what_to_try(output, hint, tmp_path):
    done = run_installer_function(
        "run_step install 'installing the locked stack' torch "
        "sh -c 'echo \"$STEP_OUTPUT\" >&2; exit 3'; echo not reached", tmp_path,
        STEP_OUTPUT=output)
    assert done.returncode == 1 and 'not reached' not in done.stdout
    assert '[install] FAILED: installing the locked stack' in done.stderr
    assert '[install]   package: torch' in done.stderr
    log = re.search(r'log: +(\S+\.log)', done.stderr)[1]
    assert osp.isfile(log) and output in open(log).read()
    assert output in done.stderr  # the log's end
    assert hint in done.stderr


def test_successful_step_says_how_long_it_took(tmp_path):
    done = run_installer_function("run_step install 'a step' pkg true", tmp_path)
    assert done.returncode == 0
    assert re.search(r'\[install\] a step \(log: .+\)\n\[install\]   done in \d+ s',
                     done.stdout)


def test_short_disk_space_stops_before_downloading(tmp_path):
    done = run_installer_function(
        f'check_disk install 100000 5 {tmp_path}/venv; echo not reached', tmp_path)
    assert done.returncode == 1 and 'not reached' not in done.stdout
    assert 'not enough free disk space' in done.stderr
    assert re.search(r'needed: +\d+ GiB', done.stderr)
    assert re.search(r'free: +\d+ GiB', done.stderr)
    assert run_installer_function(f'check_disk install 0 0 {tmp_path}/venv',
                                  tmp_path).returncode == 0


def test_disk_check_takes_a_folder_under_parents_that_do_not_exist(tmp_path):
    """``make gpu-train-bundle`` with ``MMSOFT_GPU_BUILD_DIR`` under a parent
    that does not exist yet: the check reads the nearest existing parent."""
    venv = tmp_path / 'not' / 'yet' / 'venv-build'
    done = run_installer_function(f'check_disk install 0 0 {venv} && echo checked',
                                  tmp_path)
    assert done.returncode == 0 and 'checked' in done.stdout, done.stderr
    assert 'No such file' not in done.stderr, done.stderr
    done = run_installer_function(f'check_disk install 100000 0 {venv}', tmp_path)
    assert done.returncode == 1 and f'to install {venv}:' in done.stderr


def test_disk_check_of_make_test_sums_the_environments_not_yet_installed(tmp_path):
    """`make test` keeps three environments: the disk must hold those still
    to install together, the installed one (its python imports torch) not
    counted."""
    installed = f'{osp.dirname(osp.dirname(sys.executable))}:newest'
    # The machine's own free space is not the subject: a disk of 1000 GiB.
    done = run_installer_function(
        'free_gib() { echo 1000; }; '
        f'check_disks test {tmp_path}/a:stack {tmp_path}/b:floor {installed}', tmp_path)
    assert done.returncode == 0, done.stderr
    stack, floor = (
        int(run_installer_function(f'env_disk {kind}', tmp_path).stdout.split()[0])
        for kind in ('stack', 'floor'))
    assert f'[test] to install: {tmp_path}/a {tmp_path}/b ({stack + floor} GiB' \
        in done.stdout
    assert osp.dirname(osp.dirname(sys.executable)) not in done.stdout
    short = run_installer_function(
        f'free_gib() {{ echo 1000; }}; env_disk() {{ echo "100000 1"; }}; '
        f'check_disks test {tmp_path}/a:stack; '
        'echo not reached', tmp_path)
    assert short.returncode == 1 and 'not reached' not in short.stdout
    assert 'not enough free disk space' in short.stderr
    # What the suites write is counted even when every environment is there.
    suites = run_installer_function(
        'free_gib() { echo 1000; }; '
        f'env_disk() {{ case $1 in suites) echo "0 100000";; *) echo "1 1";; esac; }}; '
        f'check_disks test {installed} .:suites; echo not reached', tmp_path)
    assert suites.returncode == 1 and 'not reached' not in suites.stdout
    assert 'not enough free disk space' in suites.stderr
    unknown = run_installer_function(f'check_disks test {tmp_path}/a:gpu', tmp_path)
    assert unknown.returncode == 1 and "unknown environment 'gpu'" in unknown.stderr


def write_lock(path, entries: Dict[str, dict]) -> str:
    """A lock file of ``{name: {'version': ..., 'hashes': [...]}}``."""
    path.write_text(''.join(f"{name}=={entry['version']} \\\n    "
                            + ' \\\n    '.join(entry['hashes']) + '\n'
                            for name, entry in entries.items()))
    return str(path)


def test_locked_install_checks_hashes_and_warm_up_writes_bytecode(tmp_path):
    """A wrong hash or a version the index lacks fails, naming what to do; a
    lock's wheel installs from the index, no module compiled, and leaves no
    cache; warm_up writes the bytecode of what it imports (mdurl imports all
    its modules) where the shell sets PYTHONDONTWRITEBYTECODE."""
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
                   check=True)
    newest = lock_entries(osp.join(REQUIREMENTS, 'locks', 'newest.txt'))
    wrong_hash = dict(newest['mdurl'], hashes=['--hash=sha256:' + '0' * 64])
    no_version = dict(version='0.0.0.1', hashes=newest['mdurl']['hashes'])
    for entry, hint in [(wrong_hash, 'does not match the hash in requirements/locks/'),
                        (no_version, 'CPython 3.11 on x86-64 Linux')]:
        lock = write_lock(tmp_path / 'bad.txt', {'mdurl': entry})
        failed = run_installer_function(f'install_locked test {venv} {lock}', tmp_path)
        assert failed.returncode == 1 and hint in failed.stderr, failed.stderr

    good = write_lock(tmp_path / 'good.txt', {'mdurl': newest['mdurl']})
    done = run_installer_function(f'install_locked test {venv} {good}', tmp_path)
    assert done.returncode == 0, done.stderr
    package = next(venv.glob('lib/python3.*/site-packages/mdurl'))
    assert not list(package.glob('__pycache__/*.pyc'))
    assert not (venv / '.uv-cache').exists()
    warmed = run_installer_function(f'warm_up {venv} -c "import mdurl"', tmp_path,
                                    PYTHONDONTWRITEBYTECODE='1')
    assert warmed.returncode == 0, warmed.stderr
    assert {path.name.split('.')[0] for path in package.glob('__pycache__/*.pyc')} \
        == {path.stem for path in package.glob('*.py')}


def test_installers_started_together_install_the_lock_tool_once(tmp_path):
    """`make test` starts two installers at once: one installs uv, the other
    waits for it."""
    done = run_installer_function(
        f'ensure_uv a > {tmp_path}/a & first=$!; ensure_uv b > {tmp_path}/b & '
        f'wait $first; wait $!; cat {tmp_path}/a {tmp_path}/b; '
        '"$LOCK_VENV/bin/uv" --version',
        tmp_path,
        LOCK_VENV=str(tmp_path / 'lock-venv'))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('installing the lock tool') == 1
    assert re.search(r'^uv \d', done.stdout, re.M)


def test_unreachable_registry_is_named(tmp_path):
    """An index on a closed loopback port: the installer says so at once."""
    done = run_installer_function(
        f'check_registry install {sys.executable}; echo not reached', tmp_path,
        PIP_INDEX_URL='http://127.0.0.1:9/simple')
    assert done.returncode == 1 and 'not reached' not in done.stdout
    assert '[install] the package registry cannot be reached' in done.stderr
    assert 'http://127.0.0.1:9/simple' in done.stderr
