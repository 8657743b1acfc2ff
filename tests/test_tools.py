"""The command-line tools end to end: train/test (``--tta``, ``--show`` too),
kill-and-resume, torchrun, mmdet's own train.py on the same config, and the
inferencers painting one image. A run whose process is not what the test is
about runs the tool's ``main`` in the test's process (:func:`run_in_process`).

Every run uses a demo config on a small generated dataset with command-line
overrides: the detector on ``small_coco`` (96x96 images) for one or a few
epochs of a few iterations at batch 2, the UperNet on ``small_ade`` (96x128
images) for a few iterations.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import glob
import math
import os
import os.path as osp
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import torch

from mmsoft.utils.torch_compat import TORCH_VERSION
from tests.helpers.tools import load_tool, run_in_process

# Every test trains or runs an mmdet/mmseg model (RoIAlign, NMS, ...): mmcv's
# compiled ops; left out of the floor run (mmcv-lite), see setup.cfg.
pytestmark = [pytest.mark.openmmlab, pytest.mark.mmcv_ops]

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIG = osp.join(REPO, 'configs/demo/mask-rcnn_soft-tiny_fpn_demo.py')
SEG_CONFIG = osp.join(REPO, 'configs/demo/upernet_soft-tiny_demo.py')
TRAIN = osp.join(REPO, 'tools/train.py')
TEST = osp.join(REPO, 'tools/test.py')
CHECK_METRIC = osp.join(REPO, 'tools/analysis/check_metric.py')
SIZE = 96


def loader_options(root: str) -> list:
    """``--cfg-options`` of all three dataloaders: data in ``root``, batch 2,
    no worker processes; and a log line per iteration."""
    options = ['default_hooks.logger.interval=1']
    for split in ('train', 'val', 'test'):
        options += [f'{split}_dataloader.dataset.data_root={root}',
                    f'{split}_dataloader.batch_size=2',
                    f'{split}_dataloader.num_workers=0',
                    f'{split}_dataloader.persistent_workers=False']
    return options


def tiny_options(root: str, train_images: int = 16) -> list:
    """``--cfg-options`` of a quick detector run on the COCO data in ``root``."""
    return loader_options(root) + [
        f'val_evaluator.ann_file={root}/annotations/instances_val.json',
        f'test_evaluator.ann_file={root}/annotations/instances_val.json',
        f'train_dataloader.dataset.pipeline.2.scale=({SIZE},{SIZE})',
        f'val_dataloader.dataset.pipeline.1.scale=({SIZE},{SIZE})',
        f'test_dataloader.dataset.pipeline.1.scale=({SIZE},{SIZE})',
        f'train_dataloader.dataset.indices={train_images}',
    ]


def env() -> dict:
    """Subprocess environment: mmsoft importable, quiet thread pools."""
    out = dict(os.environ)
    out['PYTHONPATH'] = REPO + os.pathsep + out.get('PYTHONPATH', '')
    out.setdefault('OMP_NUM_THREADS', '1')
    return out


def run(args: list, timeout: int = 240, env_extra: Optional[dict] = None,
        **kwargs) -> subprocess.CompletedProcess:
    """Runs a command and returns its result (stdout and stderr as text);
    ``env_extra`` is added to :func:`env`."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={**env(), **(env_extra or {})},
                          cwd=kwargs.pop('cwd', REPO), **kwargs)


def check(result: subprocess.CompletedProcess) -> str:
    """Asserts success; returns stdout + stderr."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture(scope='module')
def trained(small_coco, tmp_path_factory):
    """One epoch (8 iterations) of the demo detector and its validation."""
    work_dir = str(tmp_path_factory.mktemp('train'))
    start = time.time()
    output = run_in_process('train', [DET_CONFIG, '--work-dir', work_dir,
                                      '--cfg-options', *tiny_options(small_coco),
                                      'train_cfg.max_epochs=1',
                                      'train_cfg.val_interval=1'])
    return dict(work_dir=work_dir, output=output, seconds=time.time() - start,
                checkpoint=osp.join(work_dir, 'epoch_1.pth'))


def test_train_logs_and_validates(trained):
    output = trained['output']
    assert re.search(r'Epoch\(train\) +\[1\]\[8/8\]', output)
    assert re.search(r'Epoch\(val\) \[1\]\[2/2\].*coco/bbox_mAP: [0-9.]+ '
                     r'.*coco/segm_mAP: [0-9.]+', output)
    assert osp.isfile(trained['checkpoint'])
    with open(osp.join(trained['work_dir'], 'last_checkpoint')) as f:
        assert f.read().strip().endswith('epoch_1.pth')


def test_checkpoint_loads_with_weights_only(trained):
    """``import mmsoft`` allow-lists exactly what the checkpoint needs."""
    path = trained['checkpoint']
    # The globals torch does not allow by default, listed without mmsoft.
    listed = check(run([sys.executable, '-c',
                        'import sys, torch; print(sorted(torch.serialization.'
                        'get_unsafe_globals_in_checkpoint(sys.argv[1])))', path]))
    needed = set(eval(listed.strip().splitlines()[-1]))
    assert {'mmengine.logging.history_buffer.HistoryBuffer', 'numpy.ndarray',
            'builtins.getattr'} <= needed
    import mmsoft  # noqa: F401
    from mmsoft.checkpoint.safe_load import checkpoint_safe_globals
    names = {entry[1] if isinstance(entry, tuple) else
             f'{entry.__module__}.{entry.__qualname__}'
             for entry in checkpoint_safe_globals()}
    assert needed <= names
    checkpoint = torch.load(path, map_location='cpu')  # weights_only=True
    assert checkpoint['meta']['epoch'] == 1 and checkpoint['meta']['iter'] == 8
    losses = checkpoint['message_hub']['log_scalars']['train/loss']
    assert len(losses.data[0]) == 8 and losses.mean() > 0  # one per iteration


def test_test_tool_reports_coco_metrics(trained, small_coco, tmp_path):
    out = str(tmp_path / 'preds.pkl')
    show_dir = str(tmp_path / 'painted')
    output = run_in_process('test', [DET_CONFIG, trained['checkpoint'],
                                     '--work-dir', str(tmp_path), '--out', out,
                                     '--show-dir', show_dir,
                                     '--cfg-options', *tiny_options(small_coco)])
    table = dict(re.findall(r'^(coco/\w+) +([0-9.]+)$', output, re.M))
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP',
                'coco/segm_mAP_50'):
        assert 0.0 <= float(table[key]) <= 1.0
    with open(out, 'rb') as f:
        predictions = pickle.load(f)
    assert len(predictions) == 4
    assert {'bboxes', 'scores', 'labels', 'masks'} <= set(
        predictions[0]['pred_instances'])
    assert len(glob.glob(osp.join(show_dir, '*.png'))) == 4
    assert f'painted predictions: {show_dir}' in output
    # make demo's last step reads that evaluation back.
    bbox_map = float(table['coco/bbox_mAP'])
    passed = check(run([sys.executable, CHECK_METRIC, str(tmp_path), 'coco/bbox_mAP',
                        str(bbox_map)]))
    assert f'coco/bbox_mAP = {bbox_map:.3f}' in passed
    above = run([sys.executable, CHECK_METRIC, str(tmp_path), 'coco/bbox_mAP',
                 str(bbox_map + 0.01)])
    assert above.returncode == 1 and 'below the expected minimum' in above.stderr
    missing = run([sys.executable, CHECK_METRIC, str(tmp_path), 'coco/mIoU', '0'])
    assert missing.returncode == 1 and "metric='coco/mIoU'" in missing.stderr
    empty = run([sys.executable, CHECK_METRIC, str(tmp_path / 'painted'),
                 'coco/bbox_mAP', '0'])
    assert empty.returncode == 1 and 'holds no evaluation' in empty.stderr


@pytest.mark.skipif(TORCH_VERSION < (2, 2), reason="torch 2.1's dynamo fails "
                    "inside SOFT's training step (tests/test_compile.py)")
def test_train_with_mmengine_compile(small_coco, tmp_path):
    """mmengine's ``compile`` option: the Runner compiles the detector's
    ``train_step`` and trains a step. The backend is ``eager``: dynamo traces
    mmdet's code and mmsoft's alike (a minute and a half here, each further
    step recompiles mmdet's functions a while longer); AOTAutograd on the
    backbones, and a new size's graph, are tests/test_compile.py's
    (docs/testing.md). A process of its own: run in the test's process, it
    left a later run there without its logged iterations (scalars.json)."""
    output = check(run([sys.executable, TRAIN, DET_CONFIG, '--work-dir', str(tmp_path),
                        '--cfg-options', *tiny_options(small_coco, train_images=2),
                        'train_cfg.max_epochs=1', 'train_cfg.val_interval=2',
                        'compile.backend=eager'],
                       timeout=900))
    assert 'Model has been "compiled"' in output
    losses = [float(value) for value in re.findall(r' loss: ([0-9.]+)', output)]
    assert len(losses) == 1 and math.isfinite(losses[0])
    assert osp.isfile(osp.join(tmp_path, 'epoch_1.pth'))


@pytest.fixture(scope='module')
def trained_segmentor(small_ade, tmp_path_factory):
    """Four iterations of the demo UperNet and its validation."""
    work_dir = str(tmp_path_factory.mktemp('train_seg'))
    options = loader_options(small_ade) + [
        'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
        'default_hooks.checkpoint.interval=4']
    output = run_in_process('train', [SEG_CONFIG, '--work-dir', work_dir,
                                      '--cfg-options', *options])
    return dict(work_dir=work_dir, output=output, options=options,
                checkpoint=osp.join(work_dir, 'iter_4.pth'))


def test_segmentation_train_and_test(trained_segmentor, tmp_path):
    """The UperNet demo through both tools; non-square images need no padding
    in training (mmseg's class-weighted loss cannot take the ignore label)."""
    options, output = trained_segmentor['options'], trained_segmentor['output']
    assert re.search(r'Iter\(train\) +\[4/4\].*decode\.loss_ce: [0-9.]+', output)
    val = re.search(r'Iter\(val\) \[2/2\] +aAcc: [0-9.]+ +mIoU: ([0-9.]+)', output)
    assert val, output[-3000:]
    checkpoint = trained_segmentor['checkpoint']
    output = run_in_process('test', [SEG_CONFIG, checkpoint,
                                     '--work-dir', str(tmp_path / 'test'),
                                     '--cfg-options', *options])
    test = re.search(r'Iter\(test\) \[2/2\] +aAcc: [0-9.]+ +mIoU: ([0-9.]+)', output)
    assert test, output[-3000:]
    # The checkpoint of the last iteration is the model validated in training.
    assert float(test.group(1)) == float(val.group(1))


def _latest(work_dir: str) -> str:
    path = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(path):
        return ''
    with open(path) as f:
        return f.read().strip()


def test_kill_and_resume_continues(small_coco, tmp_path):
    """SIGKILL in epoch 2, ``--resume``: epochs 2 and 3 run once, state goes on."""
    work_dir = str(tmp_path)
    options = [*tiny_options(small_coco), 'train_cfg.max_epochs=3',
               'train_cfg.val_interval=10']
    proc = subprocess.Popen(
        [sys.executable, TRAIN, DET_CONFIG, '--work-dir', work_dir,
         '--cfg-options', *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
        cwd=REPO, start_new_session=True)
    deadline = time.time() + 180
    try:
        while not _latest(work_dir).endswith('epoch_1.pth'):
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.time() < deadline, 'no epoch_1 checkpoint in time'
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        first_log = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL
    killed_at = _latest(work_dir)
    assert killed_at.endswith('epoch_1.pth')
    assert not osp.exists(osp.join(work_dir, 'epoch_3.pth'))
    before = torch.load(killed_at, map_location='cpu', weights_only=False)
    assert before['meta']['iter'] == 8

    output = run_in_process('train', [DET_CONFIG, '--work-dir', work_dir,
                                      '--resume', '--cfg-options', *options])
    assert 'resumed epoch: 1, iter: 8' in output
    trained_epochs = [int(e) for e, _ in
                      re.findall(r'Epoch\(train\) +\[(\d+)\]\[ ?(\d+)/8\]', output)]
    assert trained_epochs[0] == 2 and sorted(set(trained_epochs)) == [2, 3]
    assert trained_epochs.count(2) == trained_epochs.count(3) == 8
    assert re.search(r'Epoch\(train\) +\[1\]\[8/8\]', first_log)

    final = torch.load(osp.join(work_dir, 'epoch_3.pth'), map_location='cpu')
    assert final['meta']['epoch'] == 3 and final['meta']['iter'] == 24
    steps = {float(s['step']) for s in final['optimizer']['state'].values()}
    assert steps == {24.0}  # 8 before the kill + 16 after: state was restored
    assert [s['last_step'] for s in final['param_schedulers']] == [24, 24]
    assert final['message_hub']['runtime_info']['iter'] == 23


def test_torchrun_two_processes(mixed_coco, tmp_path):
    # Images of mixed sizes: every batch is padded, and each process hands
    # its own batch's valid regions to the backbone.
    env_port = dict(PORT=str(free_port()))
    result = subprocess.run(
        ['bash', osp.join(REPO, 'tools/dist_train.sh'), DET_CONFIG, '2',
         '--work-dir', str(tmp_path), '--cfg-options', *tiny_options(mixed_coco),
         'train_cfg.max_epochs=1', 'train_cfg.val_interval=1'],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**env(), **env_port, 'PYTHON': sys.executable})
    output = check(result)
    assert 'Distributed launcher: pytorch' in output
    assert 'Distributed training: True' in output
    assert 'GPU number: 2' in output  # mmengine's name for the world size
    # 16 images, 2 per process and step, 2 processes: 4 iterations.
    assert re.search(r'Epoch\(train\) +\[1\]\[4/4\]', output)
    assert re.search(r'Epoch\(val\) \[1\]\[1/1\].*coco/bbox_mAP: [0-9.]+', output)
    checkpoint = torch.load(str(tmp_path / 'epoch_1.pth'), map_location='cpu')
    assert checkpoint['meta']['iter'] == 4


def test_mmdet_own_train_tool(small_coco, tmp_path):
    import mmdet
    tool = osp.join(osp.dirname(mmdet.__file__), '.mim/tools/train.py')
    assert osp.isfile(tool)
    output = check(run([sys.executable, tool, DET_CONFIG, '--work-dir',
                        str(tmp_path), '--cfg-options',
                        *tiny_options(small_coco, train_images=4),
                        'train_cfg.max_epochs=1', 'train_cfg.val_interval=10'],
                       cwd=str(tmp_path)))
    assert re.search(r'Epoch\(train\) +\[1\]\[2/2\]', output)
    assert torch.load(str(tmp_path / 'epoch_1.pth'),
                      map_location='cpu')['meta']['iter'] == 2


# ------------------------------------- --tta, --show and the inferencers ---
def logged_miou(output: str, loop: str = 'test') -> float:
    """The mIoU that ``loop`` ('val' or 'test') logged after its 2 batches."""
    found = re.search(rf'Iter\({loop}\) \[2/2\] +aAcc: [0-9.]+ +mIoU: ([0-9.]+)',
                      output)
    assert found, output[-3000:]
    return float(found.group(1))


def scene_image(path: str, seed: int = 5) -> np.ndarray:
    """Writes a rendered 96x128 shapes scene to ``path``; returns it (BGR)."""
    import mmcv
    from demo_data import DEFAULT_CLASSES, SHAPES, render_scene
    scene = render_scene(np.random.default_rng(seed), 96, 128, len(DEFAULT_CLASSES),
                         [SHAPES[name] for name in DEFAULT_CLASSES])
    mmcv.imwrite(scene.image, path)
    return scene.image


def test_segmentation_tta_and_show(trained_segmentor, small_ade, tmp_path):
    """``--tta --show`` on the demo UperNet: six scales times two flips of the
    same four validation images; without a display the windows fall back to
    matplotlib's agg backend with a warning, as in mmseg's tool."""
    out = tmp_path / 'label_maps'
    output = check(run([sys.executable, TEST, SEG_CONFIG,
                        trained_segmentor['checkpoint'], '--tta', '--show',
                        '--wait-time', '0.01', '--out', str(out),
                        '--work-dir', str(tmp_path), '--cfg-options',
                        *trained_segmentor['options']],
                       env_extra=dict(MPLBACKEND='agg')))
    tta = logged_miou(output)
    single_scale = logged_miou(trained_segmentor['output'], 'val')
    print(f'demo UperNet mIoU: single-scale {single_scale}, --tta {tta}')
    assert 0.0 <= tta <= 100.0
    assert "--show: matplotlib's backend 'agg' cannot open windows" in output
    images = sorted(osp.splitext(name)[0] for name in
                    os.listdir(osp.join(small_ade, 'images/validation')))
    label_maps = sorted(osp.splitext(name)[0] for name in os.listdir(out))
    assert label_maps == images and len(images) == 4


def test_detection_tta_with_mmdet_defaults(trained, small_coco, tmp_path):
    """The demo detector's boxes under ``--tta``: the config has no
    ``tta_model``/``tta_pipeline``, mmdet's flip defaults are used."""
    boxes_only = ['model.roi_head.mask_roi_extractor=None',
                  'model.roi_head.mask_head=None', 'test_evaluator.metric=bbox']
    output = run_in_process('test', [DET_CONFIG, trained['checkpoint'], '--tta',
                                     '--work-dir', str(tmp_path), '--cfg-options',
                                     *tiny_options(small_coco), *boxes_only])
    assert 'Cannot find ``tta_model`` in config' in output
    assert 'Cannot find ``tta_pipeline`` in config' in output
    table = dict(re.findall(r'^(coco/\w+) +([0-9.]+)$', output, re.M))
    assert 0.0 <= float(table['coco/bbox_mAP']) <= 1.0
    assert 'coco/segm_mAP' not in table


def test_inference_demo_paints_detections(trained, tmp_path):
    """tools/inference_demo.py: DetInferencer on the demo checkpoint."""
    image = scene_image(str(tmp_path / 'scene.png'))
    painted_file = str(tmp_path / 'painted' / 'scene.png')
    output = check(run([sys.executable, osp.join(REPO, 'tools/inference_demo.py'),
                        DET_CONFIG, trained['checkpoint'],
                        str(tmp_path / 'scene.png'), '--out-file', painted_file,
                        '--score-thr', '0']))
    shown, total = map(int, re.search(r'painted (\d+) of (\d+) instances: ',
                                      output).groups())
    assert shown == total > 0  # every instance is painted at threshold 0
    import mmcv
    painted = mmcv.imread(painted_file)
    assert painted.shape == image.shape and (painted != image).any()


def test_paint_predictions_of_the_segmentor(trained_segmentor, tmp_path):
    """MMSegInferencer on the demo checkpoint: each pixel is the image blended
    with the palette colour of its predicted class (opacity 0.8), except
    under the class names written on the image."""
    paint_predictions = load_tool('inference_demo').paint_predictions
    image = scene_image(str(tmp_path / 'scene.png'))
    painted_file = str(tmp_path / 'painted.png')
    classes = paint_predictions(SEG_CONFIG, trained_segmentor['checkpoint'],
                                str(tmp_path / 'scene.png'), painted_file)
    assert classes.shape == image.shape[:2]
    import mmcv
    from mmengine.config import Config
    palette = np.array(Config.fromfile(SEG_CONFIG).metainfo['palette'])
    expected = (image[..., ::-1] * 0.2 + palette[classes] * 0.8).astype(np.uint8)
    painted = mmcv.imread(painted_file, channel_order='rgb')
    close = np.abs(painted.astype(int) - expected).max(axis=-1) <= 1
    assert close.mean() > 0.8, close.mean()
