"""The backbones compared side by side on the demo data, and their training runs.

``tools/analysis/compare_backbones.py`` trains every entry of
:data:`DETECTORS` (Mask R-CNN, demo COCO shapes) and :data:`SEGMENTORS`
(UperNet, demo ADE20K shapes) with each seed, on the demo schedule
compressed to fewer epochs (iterations) in proportion
(:func:`detection_schedule`, :func:`segmentation_schedule`), and reads each
run's final validation metrics (:func:`final_metrics`). Each of mmsoft's
entries is a demo config (``configs/demo/``); each peer's config
(``configs/comparison/``) inherits the demo config and changes only the
backbone (and the input widths of the neck or heads).
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DEMO_CONFIGS = 'configs/demo'
PEER_CONFIGS = 'configs/comparison'


@dataclass(frozen=True)
class Entry:
    """One backbone of the comparison.

    Attributes:
        name (str): Short name used in tables and plots.
        config (str): Config path relative to the repository root.
        source (str): Where the backbone's code comes from: ``'mmsoft'``,
            ``'mmdet'``, ``'mmseg'`` or ``'timm'``.
        pair (str): The group of similar parameter count and FLOPs that the
            fair comparisons are made within.
    """
    name: str
    config: str
    source: str
    pair: str

    @property
    def ours(self) -> bool:
        """Whether the backbone is one of mmsoft's."""
        return self.source == 'mmsoft'


def _demo(config: str) -> str:
    return f'{DEMO_CONFIGS}/{config}.py'


def _peer(config: str) -> str:
    return f'{PEER_CONFIGS}/{config}.py'


# The pairs, by the backbone's parameter count: 3-7 M (the demo's half-width
# SOFT++, UFO-ViT-tiny, PVTv2-b0, XCiT-T12), 11-14 M (SOFT++-tiny,
# ResNet-18, Swin at 64 channels, PVTv2-b1) and the 22-24 M references
# (ResNet-50, PVTv2-b2-li).
SMALL, MEDIUM, LARGE = '3-7 M', '11-14 M', '22-24 M'
PAIR_PARAMS = {SMALL: (3e6, 7e6), MEDIUM: (11e6, 14e6), LARGE: (22e6, 24e6)}
DETECTORS: List[Entry] = [
    Entry('SOFT++ half-width (demo)', _demo('mask-rcnn_soft-tiny_fpn_demo'),
          'mmsoft', SMALL),
    Entry('UFO-ViT-tiny', _demo('mask-rcnn_ufo-vit-tiny_fpn_demo'), 'mmsoft',
          SMALL),
    Entry('PVTv2-b0', _peer('mask-rcnn_pvtv2-b0_fpn_demo'), 'mmdet', SMALL),
    Entry('XCiT-T12', _peer('mask-rcnn_xcit-t12_fpn_demo'), 'timm', SMALL),
    Entry('SOFT++-tiny', _demo('mask-rcnn_soft++-tiny_fpn_demo'), 'mmsoft',
          MEDIUM),
    Entry('ResNet-18', _peer('mask-rcnn_r18_fpn_demo'), 'mmdet', MEDIUM),
    Entry('Swin (64 channels)', _peer('mask-rcnn_swin-64_fpn_demo'), 'mmdet',
          MEDIUM),
    Entry('PVTv2-b1', _peer('mask-rcnn_pvtv2-b1_fpn_demo'), 'mmdet', MEDIUM),
    Entry('ResNet-50', _peer('mask-rcnn_r50_fpn_demo'), 'mmdet', LARGE),
    Entry('PVTv2-b2-li', _peer('mask-rcnn_pvtv2-b2-li_fpn_demo'), 'timm', LARGE),
]
SEGMENTORS: List[Entry] = [
    Entry('SOFT++ half-width (demo)', _demo('upernet_soft-tiny_demo'), 'mmsoft',
          SMALL),
    Entry('UFO-ViT-tiny', _demo('upernet_ufo-vit-tiny_demo'), 'mmsoft', SMALL),
    Entry('PVTv2-b0', _peer('upernet_pvtv2-b0_demo'), 'mmdet', SMALL),
    Entry('ResNet-18', _peer('upernet_r18_demo'), 'mmseg', MEDIUM),
]
# The demo configs' schedules: 8 epochs of 75 iterations with a 100-iteration
# warm-up (Mask R-CNN); 1100 iterations with a 50-iteration warm-up (UperNet).
DEMO_EPOCHS, DEMO_EPOCH_ITERS, DEMO_DET_WARMUP = 8, 75, 100
DEMO_SEG_ITERS, DEMO_SEG_WARMUP = 1100, 50
BBOX_METRIC, SEGM_METRIC, MIOU_METRIC = 'coco/bbox_mAP', 'coco/segm_mAP', 'mIoU'


def _check_positive(name: str, value: int, limit: int) -> None:
    if not 1 <= value <= limit:
        raise ValueError(f'{name} must be between 1 and {limit} (the demo '
                         f'schedule); got {value}.')


def detection_schedule(epochs: int) -> List[str]:
    """``--cfg-options`` that compress the Mask R-CNN demo schedule to
    ``epochs``: the warm-up keeps its share of the iterations, the cosine
    decay spans the epochs, validation runs once, at the end, and one
    checkpoint (the last) is kept.

    Raises:
        ValueError: When ``epochs`` is not between 1 and 8.
    """
    _check_positive('epochs', epochs, DEMO_EPOCHS)
    warmup = math.ceil(DEMO_DET_WARMUP * epochs / DEMO_EPOCHS)
    return [f'train_cfg.max_epochs={epochs}', f'train_cfg.val_interval={epochs}',
            f'param_scheduler.0.end={warmup}', f'param_scheduler.1.end={epochs}',
            f'param_scheduler.1.T_max={epochs}',
            'default_hooks.checkpoint.max_keep_ckpts=1']


def segmentation_schedule(iters: int) -> List[str]:
    """``--cfg-options`` that compress the UperNet demo schedule to ``iters``
    iterations, as :func:`detection_schedule` does.

    Raises:
        ValueError: When ``iters`` is not between 1 and 1100.
    """
    _check_positive('iters', iters, DEMO_SEG_ITERS)
    warmup = math.ceil(DEMO_SEG_WARMUP * iters / DEMO_SEG_ITERS)
    return [f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            f'param_scheduler.0.end={warmup}', f'param_scheduler.1.begin={warmup}',
            f'param_scheduler.1.end={iters}',
            f'default_hooks.checkpoint.interval={iters}',
            'default_hooks.checkpoint.max_keep_ckpts=1']


def final_metrics(work_dir: Path, keys: Sequence[str]) -> Optional[Dict]:
    """The last validation record of a finished run in ``work_dir``.

    mmengine's ``LocalVisBackend`` writes one JSON line per logged step to
    ``<work_dir>/<timestamp>/vis_data/scalars.json``; validation lines carry
    the metrics. Resumed runs have several timestamps: the newest wins.

    Args:
        work_dir (Path): The run's ``--work-dir``.
        keys (Sequence[str]): Metric names, e.g. ``coco/bbox_mAP``.

    Returns:
        dict | None: The metrics (and the ``step``), or None when no
        validation record holds them all.
    """
    for scalars in sorted(work_dir.glob('*/vis_data/scalars.json'), reverse=True):
        found = None
        for line in scalars.read_text().splitlines():
            record = json.loads(line)
            if all(key in record for key in keys):
                found = {key: record[key] for key in (*keys, 'step')}
        if found is not None:
            return found
    return None


def seed_summary(values: Sequence[float]) -> Dict:
    """Mean, minimum and maximum of one backbone's per-seed values."""
    return dict(mean=sum(values) / len(values), low=min(values),
                high=max(values), values=list(values))
