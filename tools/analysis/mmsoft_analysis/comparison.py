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
        group (str): The group of similar parameter count that the entry is
            read within.
        recipe (str): The name of its training recipe in :data:`RECIPES`:
            ``'shared'`` (the demo's), or the winner of the probe for a
            backbone that does not learn under it.
    """
    name: str
    config: str
    source: str
    group: str
    recipe: str = 'shared'

    @property
    def ours(self) -> bool:
        """Whether the backbone is one of mmsoft's."""
        return self.source == 'mmsoft'


def _demo(config: str) -> str:
    return f'{DEMO_CONFIGS}/{config}.py'


def _peer(config: str) -> str:
    return f'{PEER_CONFIGS}/{config}.py'


@dataclass(frozen=True)
class Recipe:
    """A learning rate and warm-up length for the compressed schedules.

    Attributes:
        lr (float | None): AdamW's learning rate; None keeps the demo's 1e-3.
        warmup_epochs (float | None): Length of the linear warm-up in epochs
            of the demo data (75 iterations each); None keeps the demo's
            share of the schedule (100 of 600 iterations).
    """
    lr: Optional[float] = None
    warmup_epochs: Optional[float] = None


# The shared recipe (the demo's, tuned for its SOFT) and the probe's
# alternatives for a backbone that does not learn under it.
RECIPES: Dict[str, Recipe] = {
    'shared': Recipe(),
    'warmup-1-epoch': Recipe(warmup_epochs=1),
    'lr-3e-4-warmup-1-epoch': Recipe(lr=3e-4, warmup_epochs=1),
}


# The groups, by the backbone's parameter count: 3-7 M (the demo's half-width
# SOFT++, UFO-ViT-tiny, PVTv2-b0, XCiT-T12), 11-14 M (SOFT++-tiny,
# ResNet-18, Swin at 64 channels, PVTv2-b1) and the 22-24 M references
# (ResNet-50, PVTv2-b2-li).
SMALL, MEDIUM, LARGE = '3-7 M', '11-14 M', '22-24 M'
GROUP_PARAMS = {SMALL: (3e6, 7e6), MEDIUM: (11e6, 14e6), LARGE: (22e6, 24e6)}
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
    # The recipes below are the probe's best (seed 0, full run); neither
    # makes the backbone learn (docs/comparison.md, "The probe").
    Entry('Swin (64 channels, window 5)', _peer('mask-rcnn_swin-64_fpn_demo'),
          'mmdet', MEDIUM, recipe='lr-3e-4-warmup-1-epoch'),
    Entry('PVTv2-b1', _peer('mask-rcnn_pvtv2-b1_fpn_demo'), 'mmdet', MEDIUM),
    Entry('ResNet-50', _peer('mask-rcnn_r50_fpn_demo'), 'mmdet', LARGE),
    Entry('PVTv2-b2-li', _peer('mask-rcnn_pvtv2-b2-li_fpn_demo'), 'timm', LARGE,
          recipe='warmup-1-epoch'),
]
SEGMENTORS: List[Entry] = [
    Entry('SOFT++ half-width (demo)', _demo('upernet_soft-tiny_demo'), 'mmsoft',
          SMALL),
    Entry('UFO-ViT-tiny', _demo('upernet_ufo-vit-tiny_demo'), 'mmsoft', SMALL),
    Entry('PVTv2-b0', _peer('upernet_pvtv2-b0_demo'), 'mmdet', SMALL),
    Entry('ResNet-18', _peer('upernet_r18_demo'), 'mmseg', MEDIUM),
]
# The probe (``compare_backbones.py --phases probe``): each recipe for the
# two backbones that did not learn under the shared recipe, and for mmdet's
# PVTv2 at PVTv2-b2-li's depths (a control for timm's implementation): the
# first epoch of the compressed Mask R-CNN schedule, then the full run
# (seed 0) resumed from it.
PROBE_CONTROL = Entry('PVTv2-b2 (control)', _peer('mask-rcnn_pvtv2-b2_fpn_demo'),
                      'mmdet', LARGE)
PROBE_DETECTORS: List[Entry] = [
    *[entry for entry in DETECTORS
      if entry.name in ('Swin (64 channels, window 5)', 'PVTv2-b2-li')],
    PROBE_CONTROL]
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


def recipe_options(recipe: str, epochs: int) -> List[str]:
    """``--cfg-options`` that apply ``recipe`` (a key of :data:`RECIPES`) to
    the Mask R-CNN schedule compressed to ``epochs``.

    Raises:
        ValueError: When ``recipe`` is not known.
    """
    if recipe not in RECIPES:
        raise ValueError(f'recipe {recipe!r} is not known; expected one of '
                         f'{list(RECIPES)}.')
    settings, options = RECIPES[recipe], []
    if settings.lr is not None:
        options.append(f'optim_wrapper.optimizer.lr={settings.lr}')
    if settings.warmup_epochs is not None:
        warmup = math.ceil(settings.warmup_epochs * DEMO_EPOCH_ITERS)
        options.append(f'param_scheduler.0.end={min(warmup, epochs * DEMO_EPOCH_ITERS)}')
    return options


def probe_options() -> List[str]:
    """``--cfg-options`` that stop a compressed run after its first epoch and
    validate there. Everything else (the schedule's length, so the
    learning rate at each step) is that of the full run, which continues
    from the probe's checkpoint with ``--resume``."""
    return ['train_cfg.max_epochs=1', 'train_cfg.val_interval=1']


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


def _records(work_dir: Path):
    """Every JSON line of every ``scalars.json`` of the run in ``work_dir``,
    oldest first."""
    for scalars in sorted(work_dir.glob('*/vis_data/scalars.json')):
        for line in scalars.read_text().splitlines():
            yield json.loads(line)


def first_epoch_metrics(work_dir: Path, keys: Sequence[str]) -> Optional[Dict]:
    """The validation after the first epoch (``step`` 1) of the run in
    ``work_dir``, as :func:`final_metrics` reads the last one; None when it
    has not run."""
    found = None
    for record in _records(work_dir):
        if record.get('step') == 1 and all(key in record for key in keys):
            found = {key: record[key] for key in (*keys, 'step')}
    return found


def epoch_loss(work_dir: Path, epoch_iters: int, share: float = 0.4) -> Optional[float]:
    """The mean logged training loss over the last ``share`` of the first
    epoch (``epoch_iters`` iterations): a less noisy sign of early learning
    than an mAP near zero."""
    first = epoch_iters * (1 - share)
    losses = [record['loss'] for record in _records(work_dir)
              if 'loss' in record and first < record['step'] <= epoch_iters]
    return sum(losses) / len(losses) if losses else None


def seed_summary(values: Sequence[float]) -> Dict:
    """Mean, minimum and maximum of one backbone's per-seed values."""
    return dict(mean=sum(values) / len(values), low=min(values),
                high=max(values), values=list(values))
