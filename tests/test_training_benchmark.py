"""The benchmark tool's training mode: backbones, detectors, batch capacity."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack and floor environments')

import csv
import json
import subprocess
import sys
from pathlib import Path


from mmsoft_analysis import worker_env
from mmsoft_analysis.batch_capacity import largest_batch
from mmsoft_analysis.detector_step import detector_config

pytestmark = pytest.mark.openmmlab

REPO = Path(__file__).resolve().parents[1]


def test_largest_batch_extrapolates_the_line_through_two_peaks():
    # 1 GB fixed + 3 GB per image: 5 images take 16 GB.
    found = largest_batch({1: 4 * 10**9, 2: 7 * 10**9}, 16 * 10**9)
    assert found == dict(largest_batch=5, per_image_bytes=3 * 10**9,
                         fixed_bytes=10**9, measured_batches=[1, 2])
    assert largest_batch({1: 4 * 10**9, 3: 10 * 10**9}, 3 * 10**9)['largest_batch'] == 0


def test_largest_batch_rejects_unusable_peaks():
    with pytest.raises(ValueError, match='two or more'):
        largest_batch({1: 10}, 100)
    with pytest.raises(ValueError, match='do not grow'):
        largest_batch({1: 10, 2: 10}, 100)


def test_pvtv2_mask_rcnn_is_the_swin_config_with_its_backbone():
    swin, pvt = detector_config('swin-t'), detector_config('pvtv2-b2')
    assert pvt.model.backbone.type == 'PyramidVisionTransformerV2'
    assert pvt.model.neck.in_channels == [64, 128, 320, 512]
    assert pvt.model.roi_head == swin.model.roi_head
    with pytest.raises(ValueError, match="detector 'r50' is not known"):
        detector_config('r50')


def test_timm_peer_mask_rcnns_are_the_swin_config_with_their_backbones():
    # Configs only: timm and mmpretrain are imported when the detector is built.
    swin = detector_config('swin-t')
    li, xcit = detector_config('pvtv2-b2-li'), detector_config('xcit-s12')
    # XCiT's timm trunk sits inside its detection resampling to strides 4-32.
    assert xcit.model.backbone.type == 'IsotropicPyramid'
    assert xcit.model.backbone.embed_dims == 384
    xcit_trunk = xcit.model.backbone.trunk
    for cfg, timm_model in ((li, li.model.backbone), (xcit, xcit_trunk)):
        assert timm_model.type == 'mmpretrain.TIMMBackbone'
        assert timm_model.features_only and not timm_model.pretrained
        assert cfg.model.roi_head == swin.model.roi_head
        assert cfg.model.rpn_head == swin.model.rpn_head
    assert li.model.backbone.model_name == 'pvt_v2_b2_li'
    assert tuple(li.model.backbone.out_indices) == (0, 1, 2, 3)
    assert li.model.neck.in_channels == [64, 128, 320, 512]
    # XCiT's detection settings.
    assert xcit_trunk.model_name == 'xcit_small_12_p16_224'
    assert tuple(xcit_trunk.out_indices) == (3, 5, 7, 11)
    assert xcit_trunk.drop_path_rate == 0.05
    assert xcit.model.neck.in_channels == [384] * 4
    assert swin.model.neck.in_channels == [96, 192, 384, 768]  # not changed


@pytest.mark.mmcv_ops  # times a Mask R-CNN step
def test_training_mode_writes_backbones_detectors_and_capacity(tmp_path):
    out_dir = tmp_path / 'bench'
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/benchmark.py'), '--mode',
         'train', '--models', 'soft-tiny', '--sizes', '64x64', '--batch', '2',
         '--peak-sizes', '64x96', '--detectors', 'soft++-tiny',
         '--detector-sizes', '64x64',
         # Large enough that a second image's activations (about 50 MB)
         # stand out from the first call's library set-up (about 160 MB,
         # varying by a few MB) in both measured peaks.
         '--detector-batch', '1', '--capacity-size', '256x256',
         '--memory-limit-gb', '2', '--repeats', '1', '--warmup', '0',
         '--device', 'cpu', '--out-dir', str(out_dir)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    data = json.loads((out_dir / 'results.json').read_text())
    assert data['meta']['mode'] == 'forward+backward'
    backbone, = data['results']
    assert (backbone['mode'], backbone['batch']) == ('forward+backward', 2)
    assert backbone['cpu_seconds'] > 0 and backbone['peak_bytes'] > 0
    assert 0 < backbone['live_peak_bytes']
    detector, = data['detectors']
    assert (detector['model'], detector['mode'], detector['batch']) == (
        'soft++-tiny', 'train_step', 1)
    assert set(detector['saved_bytes']) >= {'backbone', 'neck', 'rpn_head',
                                            'roi_head'}
    assert all(detector['saved_bytes'][part] > 0 for part in ('backbone', 'neck'))
    assert detector['live_peak_bytes'] > 0
    peak, = data['peaks']
    assert (peak['model'], peak['height'], peak['width']) == ('soft-tiny', 64, 96)
    assert peak['peak_bytes'] > 0 and 'seconds' not in peak
    with open(out_dir / 'peaks.csv') as file:
        assert int(next(csv.DictReader(file))['peak_bytes']) == peak['peak_bytes']
    capacity, = data['capacity']
    peaks = {int(batch): peak for batch, peak in capacity['peaks'].items()}
    assert capacity['largest_batch'] == largest_batch(
        peaks, 2 * 10**9)['largest_batch']
    assert capacity['method'] == 'linear from the live peaks of batches 1 and 2'
    with open(out_dir / 'detectors.csv') as file:
        row, = csv.DictReader(file)
    assert int(row['saved_backbone']) == detector['saved_bytes']['backbone']
    assert int(row['live_peak_bytes']) == detector['live_peak_bytes']
    with open(out_dir / 'capacity.csv') as file:
        assert int(next(csv.DictReader(file))['largest_batch']) == \
            capacity['largest_batch']
    assert 'largest batch at 256x256 within 2.0 GB' in done.stdout


LIVE_MEMORY_PROBE = """
import torch
from mmsoft_analysis.measure import _status_kib, track_live_memory
track_live_memory()
warm_up = torch.ones(2**20)  # the first allocation's one-off code pages, not counted
del warm_up
before = _status_kib('VmRSS')
blocks = [torch.ones(2**20) for _ in range(64)]  # 64 x 4 MiB
held = _status_kib('VmRSS')
del blocks
print(held - before, _status_kib('VmRSS') - before)
"""


def test_live_memory_returns_freed_blocks_at_once():
    done = subprocess.run([sys.executable, '-c', LIVE_MEMORY_PROBE],
                          env=worker_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    held, after_free = (int(v) for v in done.stdout.split())
    assert held >= 250 * 1024  # KiB: the 256 MiB were resident
    assert after_free < 8 * 1024  # and went back to the system when freed
