"""The offline OpenMMLab training bundle (``tools/gpu_node.sh pack train``) and
its run on the GPU node (``run train``), without a GPU and
without building mmcv:

- the bundle's locks: requirements/gpu-train.txt pinned with hashes for
  CPython 3.12 on manylinux_2_28 x86-64, without what the node provides
  (requirements/gpu-train-node.txt) or mmcv (built); every dependency of a
  locked wheel is locked, the node's, or mmcv (pip's dry run on the index:
  metadata only; skipped when no index answers); the build environment pins
  the node's torch and CUDA 13.0's compiler;
- the command's argument checks, its refusal without torch, CUDA or a GPU
  (exit status 3, naming which), its checks of the bundle (exit status 2)
  and of the node against the bundle's manifest (exit status 3, naming
  the missing package or the torch that differs);
- the table of training runs (tools/gpu_node.py table) from
  mmengine's logs, and, where the OpenMMLab stack is installed, from a real
  training run's.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

import gpu_node
from tests.helpers.tools import run_in_process
from tests.test_gpu_bundle import (PLATFORM, SECONDS, SUPPORTED_TAGS, UNREACHABLE,
                                   fake_torch, locked_pins, requirement_names)

# The GPU node's scripts and locks, which no torch release here changes
# (setup.cfg's markers).
pytestmark = pytest.mark.scripts

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / 'requirements'
LOCK = REQUIREMENTS / 'locks' / 'gpu-train.txt'
BUILD_LOCK = REQUIREMENTS / 'locks' / 'gpu-train-build.txt'
GPU_NODE = str(REPO / 'tools' / 'gpu_node.sh')
BUNDLE_SCRIPT = [GPU_NODE, 'pack', 'train']
OFFLINE = [GPU_NODE, 'run', 'train']
TABLE = REPO / 'tools' / 'gpu_node.py'
#: pip's environment markers on the node: CPython 3.12 on x86-64 Linux.
NODE_MARKERS = dict(python_version='3.12', python_full_version='3.12.3',
                    implementation_name='cpython',
                    platform_python_implementation='CPython', sys_platform='linux',
                    platform_system='Linux', os_name='posix', platform_machine='x86_64',
                    extra='')


def requirements_in(path: Path) -> list:
    return [Requirement(line.split('#', 1)[0].strip())
            for line in path.read_text().splitlines() if line.split('#', 1)[0].strip()]


NODE = requirement_names(REQUIREMENTS / 'gpu-train-node.txt')


# --------------------------------------------------------------------------
# The locks
# --------------------------------------------------------------------------
@pytest.mark.parametrize('lock, source', [(LOCK, 'gpu-train.txt'),
                                          (BUILD_LOCK, 'gpu-train-build.txt')])
def test_locks_pin_every_requirement_with_hashes(lock, source):
    assert f'target: CPython 3.12, {PLATFORM}' in lock.read_text()
    assert 'make gpu-train-bundle-lock' in lock.read_text()
    pins = locked_pins(lock)
    for requirement in requirements_in(REQUIREMENTS / source):
        name = canonicalize_name(requirement.name)
        assert name in pins, f'{lock.name} lacks {name}: run make gpu-train-bundle-lock'
        assert requirement.specifier.contains(pins[name][0], prereleases=True), \
            f'{lock.name} pins {name}=={pins[name][0]}, {source} asks {requirement}'
    for name, (version, hashes) in pins.items():
        assert version and hashes, f'{name} is not pinned with hashes in {lock}'


def test_bundle_lock_leaves_out_the_node_and_mmcv():
    """The node's packages and their own dependencies (Matplotlib's
    fonttools, say) are not carried; mmcv is compiled, not downloaded; the
    OpenMMLab packages and mmcv's own requirements are."""
    pins = locked_pins(LOCK)
    assert {'torch', 'numpy', 'pillow', 'opencv-python', 'opencv-python-headless',
            'scipy', 'matplotlib'} <= NODE
    left_out = NODE | {'mmcv', 'mmcv-lite', 'fonttools', 'kiwisolver', 'contourpy'}
    assert not left_out & set(pins)
    assert not [name for name in pins if name.startswith('nvidia-') or name == 'triton']
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'pycocotools', 'addict', 'yapf',
            'pyyaml', 'packaging', 'ftfy', 'regex'} <= set(pins)


def test_build_lock_is_the_node_torch_with_cuda_13_compiler():
    pins = locked_pins(BUILD_LOCK)
    assert pins['torch'][0] == '2.11.0'
    for name in ('nvidia-cuda-nvcc', 'nvidia-cuda-cccl', 'nvidia-cuda-runtime',
                 'nvidia-cuda-crt', 'nvidia-nvvm'):
        assert pins[name][0].startswith('13.0.'), (name, pins[name][0])
    constraints = {canonicalize_name(r.name): r for r in
                   requirements_in(REQUIREMENTS / 'build-constraints.txt')}
    for name in ('setuptools', 'wheel'):
        assert str(constraints[name].specifier) == f'=={pins[name][0]}'


def lock_report(tmp_path) -> dict:
    """pip's report of a dry run of the bundle's lock for the node's target
    (metadata only, no wheel installed); skips where no index answers."""
    options = ['--dry-run', '--ignore-installed', '--no-deps', '--require-hashes',
               '--only-binary=:all:', '--python-version', '3.12',
               '--implementation', 'cp', '--platform', PLATFORM,
               '--target', str(tmp_path / 'site'),
               '--report', str(tmp_path / 'report.json'),
               '--timeout', '10', '--retries', '1']
    try:
        done = subprocess.run(
            [sys.executable, '-m', 'pip', 'install', '--quiet',
             '--disable-pip-version-check', *options, '-r', str(LOCK)],
            capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip('the package index did not answer within 180 s')
    if done.returncode:
        reason = UNREACHABLE.search(done.stdout + done.stderr) \
            or re.search(r'no such option: \S+', done.stderr)
        if reason:
            pytest.skip(f'no dry run of the lock here: {reason.group(0)}')
        pytest.fail(done.stdout + done.stderr)
    return json.loads((tmp_path / 'report.json').read_text())


def test_bundle_lock_is_complete_for_cpython_312(tmp_path):
    """pip's dry run of the lock for the node's target: a wheel of each
    pinned file, and every dependency of every locked wheel is locked, the
    node's, or mmcv."""
    report = lock_report(tmp_path)
    pins = locked_pins(LOCK)
    resolved = {}
    for item in report['install']:
        name = canonicalize_name(item['metadata']['name'])
        filename = item['download_info']['url'].rsplit('/', 1)[-1].split('#')[0]
        assert filename.endswith('.whl'), f'{name} resolved to {filename}, not a wheel'
        assert parse_wheel_filename(filename)[3] & SUPPORTED_TAGS, filename
        resolved[name] = item['metadata']
    assert {name: meta['version'] for name, meta in resolved.items()} == \
        {name: version for name, (version, _) in pins.items()}
    available = set(pins) | NODE | {'mmcv'}
    for name, meta in resolved.items():
        for text in meta.get('requires_dist', []):
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(NODE_MARKERS):
                continue
            assert canonicalize_name(requirement.name) in available, \
                f"{name} needs {requirement}, which is neither in the bundle nor " \
                "the node's"


def test_bundle_script_checks_its_arguments():
    for args, env, message in [
            ([*BUNDLE_SCRIPT, '--bogus'], {}, 'unknown option: --bogus'),
            ([*BUNDLE_SCRIPT, 'a', 'b'], {}, 'one OUT_DIR at most'),
            ([GPU_NODE, 'lock', 'train', 'x'], {}, 'lock takes no arguments'),
            (BUNDLE_SCRIPT, {'TORCH_CUDA_ARCH_LIST': 'sm_90'},
             'TORCH_CUDA_ARCH_LIST=sm_90: expected')]:
        done = subprocess.run(['bash', *args], capture_output=True,
                              text=True, timeout=SECONDS, env={**os.environ, **env})
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    done = subprocess.run(['bash', GPU_NODE, '--help'], capture_output=True,
                          text=True, timeout=SECONDS)
    assert done.returncode == 0 and 'gpu-train-manifest.json' in done.stdout


# --------------------------------------------------------------------------
# The command on the node
# --------------------------------------------------------------------------
def run_offline(tmp_path, python, *args, extra_env=None, bundle=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ('MMSOFT_GPU_CHECK_DEVICE', 'PYTHONPATH', 'MIN_BBOX_MAP')}
    env.update(PYTHON=str(python), WORK_ROOT=str(tmp_path / 'runs'),
               **(extra_env or {}))
    start = time.monotonic()
    done = subprocess.run(
        ['bash', *OFFLINE, str(bundle or tmp_path / 'bundle'), str(tmp_path / 'out'),
         *args], capture_output=True, text=True, env=env, timeout=SECONDS)
    return done, time.monotonic() - start


def training_bundle(tmp_path, built_torch='0.0+fake', node=('numpy',), mmcv=True):
    """A bundle folder as ``tools/gpu_node.sh pack train`` lays it out, with empty
    wheels (the checks before the install read names and the manifest),
    built for ``built_torch`` (by default the stand-in torch's version)."""
    bundle = tmp_path / 'bundle'
    bundle.mkdir()
    wheels = ['mmengine-0.10.7-py3-none-any.whl']
    if mmcv:
        wheels.append('mmcv-2.1.0-cp312-cp312-linux_x86_64.whl')
    for wheel in wheels:
        (bundle / wheel).write_bytes(b'')
    (bundle / 'gpu-train-node.txt').write_text(
        '# what the node provides\n' + ''.join(f'{name}\n' for name in node))
    (bundle / 'gpu-train-manifest.json').write_text(json.dumps(dict(
        mmcv=dict(wheel=wheels[-1], torch=built_torch, cuda='13.0',
                  arch_list='8.0;9.0'))))
    return bundle


@pytest.mark.parametrize('args, env, message', [
    (['--budget-s', '10'], {}, '--budget-s 10: expected whole seconds, 60 or more'),
    (['--budget-s'], {}, '--budget-s : expected whole seconds'),
    (['--speed-iters', '1'], {},
     '--speed-iters 1: expected a whole number of iterations'),
    (['--speed-iters=ten'], {}, '--speed-iters ten: expected'),
    (['--bogus'], {}, 'unknown argument: --bogus'),
    ([], {'MIN_BBOX_MAP': '25'}, 'MIN_BBOX_MAP=25: expected a number from 0 to 1'),
])
def test_checks_its_arguments_first(tmp_path, args, env, message):
    """Invalid arguments: exit status 2 naming the argument, its value and
    what is accepted, before torch is imported (a python without torch)."""
    done, seconds = run_offline(tmp_path, '/nonexistent/python3', *args, extra_env=env)
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr
    assert seconds < SECONDS and not (tmp_path / 'out').exists()


def test_usage(tmp_path):
    done = subprocess.run(['bash', *OFFLINE, 'only-one-folder'], capture_output=True,
                          text=True, timeout=SECONDS)
    assert done.returncode == 2 and 'BUNDLE OUT_DIR' in done.stderr
    done = subprocess.run(['bash', *OFFLINE, '--help'], capture_output=True, text=True,
                          timeout=SECONDS)
    assert done.returncode == 0 and 'Exit status' in done.stdout


def test_refuses_without_a_gpu_naming_what_is_missing(tmp_path):
    """Exit status 3 at once, before the bundle is looked at: no python, a
    CPU-only torch, a CUDA torch without a device (stand-ins), and this
    Python's torch where it sees no GPU."""
    torch = pytest.importorskip('torch')
    cases = [('/nonexistent/python3', {},
              'no torch: PYTHON=/nonexistent/python3 cannot be run'),
             (sys.executable, dict(PYTHONPATH=fake_torch(tmp_path, None)),
              'torch without CUDA: torch 0.0+fake')]
    if not torch.cuda.is_available():
        cpu_only = torch.version.cuda is None and \
            getattr(torch.version, 'hip', None) is None
        cases.append((sys.executable, {},
                      'torch without CUDA' if cpu_only else 'no GPU visible'))
    for python, env, reason in cases:
        done, seconds = run_offline(tmp_path, python, extra_env=env)
        assert done.returncode == 3 and reason in done.stderr, \
            (python, env, done.stderr)
        assert python.startswith('/nonexistent') or '--allow-cpu' in done.stderr
        assert seconds < SECONDS and not (tmp_path / 'out').exists()
    cuda_build = tmp_path / 'cuda-build'
    done, _ = run_offline(tmp_path, sys.executable,
                          extra_env=dict(PYTHONPATH=fake_torch(cuda_build, '13.0')))
    assert done.returncode == 3 and 'no GPU visible: torch 0.0+fake' in done.stderr
    assert 'built for CUDA 13.0' in done.stderr


@pytest.mark.parametrize('case, message', [
    ('missing', 'no such folder'),
    ('empty', 'holds no wheels'),
    ('torch wheel', "the node's own is used"),
    ('backbone bundle', 'not a training bundle'),
    ('no mmcv', 'holds no mmcv wheel'),
    ('checksums', 'does not match its SHA256SUMS'),
])
def test_refuses_a_bad_bundle(tmp_path, case, message):
    if case == 'empty':
        (tmp_path / 'bundle').mkdir()
    elif case == 'torch wheel':
        training_bundle(tmp_path)
        wheel = 'torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl'
        (tmp_path / 'bundle' / wheel).write_bytes(b'')
    elif case == 'backbone bundle':  # pack check's: pytest, mmsoft
        (tmp_path / 'bundle').mkdir()
        (tmp_path / 'bundle' / 'pytest-9.2.0-py3-none-any.whl').write_bytes(b'')
    elif case == 'no mmcv':
        training_bundle(tmp_path, mmcv=False)
    elif case == 'checksums':
        bundle = training_bundle(tmp_path)
        (bundle / 'SHA256SUMS').write_text(
            '0' * 64 + '  mmengine-0.10.7-py3-none-any.whl\n')
    done, _ = run_offline(tmp_path, sys.executable, '--allow-cpu',
                          extra_env=dict(PYTHONPATH=fake_torch(tmp_path, '13.0')))
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / 'out').exists()


def test_refuses_a_node_without_the_packages_it_provides(tmp_path):
    """Every package of the bundle's gpu-train-node.txt must import with the
    node's python (OpenCV's distributions as cv2); those that do not are
    named, with their import name."""
    training_bundle(tmp_path, node=('numpy', 'opencv-python-headless', 'opencv-python',
                                    'no-such-package-here'))
    stand_ins = tmp_path / 'stand-ins'  # the node's NumPy and OpenCV, say
    stand_ins.mkdir()
    (stand_ins / 'numpy.py').write_text('')
    (stand_ins / 'cv2.py').write_text('')
    done, _ = run_offline(tmp_path, sys.executable, '--allow-cpu', extra_env=dict(
        PYTHONPATH=fake_torch(tmp_path, '13.0') + os.pathsep + str(stand_ins)))
    assert done.returncode == 3, done.stdout + done.stderr
    missing = done.stderr.split('missing on the node: ')[1:]
    assert len(missing) == 1 and missing[0].startswith(
        'no-such-package-here (import no_such_package_here: ModuleNotFoundError')
    assert 'install them there, or carry their wheels' in done.stderr
    assert "the node's torch" not in done.stderr
    assert not (tmp_path / 'out').exists()


def test_refuses_a_node_whose_torch_is_not_the_bundles(tmp_path):
    training_bundle(tmp_path, built_torch='2.14.1+cu130')
    done, _ = run_offline(tmp_path, sys.executable, '--allow-cpu',
                          extra_env=dict(PYTHONPATH=fake_torch(tmp_path, '13.0')))
    assert done.returncode == 3, done.stdout + done.stderr
    assert ("the node's torch 0.0+fake (CUDA 13.0) is not the torch the bundle's mmcv "
            'was compiled against, 2.14.1+cu130 (CUDA 13.0)') in done.stderr


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------
def write_scalars(work_dir: Path, entries, timestamp='20261206_120000'):
    folder = work_dir / timestamp / 'vis_data'
    folder.mkdir(parents=True)
    with open(folder / 'scalars.json', 'w') as file:
        for entry in entries:
            file.write(json.dumps(entry) + '\n')


def test_table_from_mmengine_logs(tmp_path):
    """Seconds per iteration leave out the first logged interval and weight
    each entry by the iterations it covers; images per second follow from
    the batch; peak memory is the largest logged; the demo's mAP comes from
    its newest evaluation; time against Swin-T where both were timed alike."""
    demo, soft, swin, failed = (tmp_path / name
                                for name in ('demo', 'soft', 'swin', 'failed'))
    write_scalars(demo, [dict(iter=10, time=2.0, loss=3.0, memory=900, lr=0.1),
                         dict(iter=20, time=0.5, loss=2.0, memory=1000, lr=0.1),
                         dict(iter=25, time=0.8, loss=1.5, memory=950, lr=0.1),
                         # an evaluation's line: no loss, not an iteration
                         dict(step=25, time=0.1)])
    (demo / '20261206_130000').mkdir()
    (demo / '20261206_130000' / '20261206_130000.json').write_text(
        json.dumps({'coco/bbox_mAP': 0.41, 'coco/segm_mAP': 0.39}))
    for work_dir, seconds in ((soft, 0.3), (swin, 0.6)):
        write_scalars(work_dir, [dict(iter=10, time=1.0, loss=1.0),
                                 dict(iter=20, time=seconds, loss=1.0)])
    write_scalars(failed, [dict(iter=10, time=1.0, loss=1.0)])
    out = tmp_path / 'out'
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(TABLE), 'table', '--out', str(out),
         '--device', 'a test device',
         '--run', 'label=demo', f'work_dir={demo}', 'batch=8', 'size=160x160',
         f'metrics={demo}', 'status=0',
         '--run', 'label=soft++-tiny', f'work_dir={soft}', 'batch=2', 'size=800x800',
         '--run', 'label=swin-t', f'work_dir={swin}', 'batch=2', 'size=800x800',
         '--run', 'label=ufo-vit-tiny', f'work_dir={failed}', 'batch=2', 'size=800x800',
         'status=124', '--note', 'a note'],
        capture_output=True, text=True, timeout=SECONDS, cwd=REPO)
    assert done.returncode == 0, done.stderr
    written = json.loads((out / 'gpu_train.json').read_text())
    rows = {row['label']: row for row in written['runs']}
    seconds = (0.5 * 10 + 0.8 * 5) / 15
    assert rows['demo']['seconds_per_iter'] == pytest.approx(seconds)
    assert rows['demo']['images_per_s'] == pytest.approx(8 / seconds)
    assert rows['demo']['iterations_timed'] == 15
    assert rows['demo']['iterations_logged'] == 25
    assert rows['demo']['peak_memory_mib'] == 1000
    assert rows['demo']['coco/bbox_mAP'] == 0.41
    assert rows['demo']['coco/segm_mAP'] == 0.39
    assert rows['demo']['time_vs_swin-t'] is None  # another size and batch
    assert rows['soft++-tiny']['time_vs_swin-t'] == pytest.approx(0.5)
    assert rows['soft++-tiny']['peak_memory_mib'] is None
    assert rows['ufo-vit-tiny']['seconds_per_iter'] is None
    assert rows['ufo-vit-tiny']['status'] == 'stopped by the budget'
    text = (out / 'gpu_train.md').read_text()
    assert 'a test device' in text and 'a note' in text
    assert (f'| demo | 8 | 160x160 | 15 of 25 | {seconds:.3f} | {8 / seconds:.2f} | – '
            '| 1000 | 0.410 | 0.390 | ok |') in text
    assert ('| ufo-vit-tiny | 2 | 800x800 | 0 of 10 | – | – | – | – | – | – '
            '| stopped by the budget |') in text


@pytest.mark.parametrize('items, message', [
    (['label=a', 'batch=2', 'size=1x1'], 'missing work_dir'),
    (['label=a', 'work_dir=b', 'batch=two', 'size=1x1'], "batch='two'"),
    (['label=a', 'work_dir=b', 'batch=2', 'size=1x1', 'speed=fast'], "'speed=fast'"),
    (['label=a', 'label=b', 'work_dir=b', 'batch=2', 'size=1x1'], 'label given twice'),
])
def test_table_checks_its_runs(items, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gpu_node.parse_run(items)


@pytest.mark.openmmlab
@pytest.mark.mmcv_ops
def test_table_from_a_training_run(small_coco, tmp_path):
    """The table reads what tools/train.py writes: four iterations of the
    demo detector on the CPU, logged one by one, the first left out, without
    validation, as the command's speed runs train."""
    work_dir = tmp_path / 'demo'
    options = ['default_hooks.logger.interval=1', 'train_cfg.max_epochs=1',
               'val_dataloader=None', 'val_cfg=None', 'val_evaluator=None',
               'train_dataloader.batch_size=2',
               'train_dataloader.num_workers=0',
               'train_dataloader.persistent_workers=False',
               f'train_dataloader.dataset.data_root={small_coco}',
               'train_dataloader.dataset.indices=8',
               'train_dataloader.dataset.pipeline.2.scale=(96,96)']
    run_in_process('train', [str(REPO / 'configs/demo/mask-rcnn_soft-tiny_fpn_demo.py'),
                             '--work-dir', str(work_dir), '--cfg-options', *options])
    rows = gpu_node.table_rows([dict(label='demo', work_dir=str(work_dir), batch='2',
                                     size='96x96')], skip=1)
    assert rows[0]['iterations_logged'] == 4 and rows[0]['iterations_timed'] == 3
    assert 0 < rows[0]['seconds_per_iter'] < 60
    assert rows[0]['images_per_s'] == pytest.approx(2 / rows[0]['seconds_per_iter'])
