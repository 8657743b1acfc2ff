"""``--tta``: test-time augmentation, as mmdet's and mmseg's ``tools/test.py``.

The model is wrapped in the config's ``tta_model`` (``SegTTAModel``,
``DetTTAModel``) and the test images go through ``tta_pipeline``, whose
``TestTimeAug`` gives several views of each image (scales, flips); the
wrapper merges the views' predictions into one per image.

- mmseg: the config must have both (mmseg's UperNet bases do: six scales
  times two flips).
- mmdet: missing ones get mmdet's defaults, with a warning: ``DetTTAModel``
  (NMS at IoU 0.5, 100 boxes) and the test pipeline whose last transform
  becomes a flipped and an unflipped view.
"""
import copy
import warnings
from typing import Iterator, List

from mmengine.config import Config, ConfigDict

from .data_paths import leaf_datasets

#: Meta keys of the packed views of mmdet's default ``tta_pipeline``.
DET_TTA_META_KEYS = ('img_id', 'img_path', 'ori_shape', 'img_shape',
                     'scale_factor', 'flip', 'flip_direction')


def default_det_tta_model() -> dict:
    """mmdet's default ``tta_model``: boxes of the views merged by NMS."""
    return dict(type='DetTTAModel',
                tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5),
                             max_per_img=100))


def flip_tta_pipeline(test_pipeline: List[dict]) -> List[dict]:
    """mmdet's default ``tta_pipeline``: ``test_pipeline`` whose last
    transform (the packing) becomes a ``TestTimeAug`` of a horizontally
    flipped and an unflipped view, each packed with the flip in its meta."""
    flip_views = [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)]
    pack = [dict(type='PackDetInputs', meta_keys=DET_TTA_META_KEYS)]
    pipeline = copy.deepcopy(list(test_pipeline))
    pipeline[-1] = dict(type='TestTimeAug', transforms=[flip_views, pack])
    return pipeline


def keys_named(node, name: str, where: str = 'model') -> Iterator[str]:
    """The config keys (``model.roi_head.mask_head``) of every non-empty
    entry called ``name`` in a nested config."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == name and value:
                yield f'{where}.{key}'
            yield from keys_named(value, name, f'{where}.{key}')


def check_det_tta_model(cfg: Config, config_path: str) -> None:
    """Refuses ``DetTTAModel`` on a model that predicts masks.

    Raises:
        ValueError: ``tta_model`` is ``DetTTAModel``, which merges boxes only
            (it asserts there are no masks), and the model has a mask head.
    """
    if cfg.tta_model.get('type') != 'DetTTAModel':
        return
    mask_heads = list(keys_named(cfg.model, 'mask_head'))
    if mask_heads:
        raise ValueError(
            f"--tta: mmdet's DetTTAModel merges boxes only and the model of "
            f'{config_path} predicts masks ({mask_heads[0]}). Test without '
            '--tta, or test the boxes alone, e.g. for Mask R-CNN: --cfg-options '
            'model.roi_head.mask_roi_extractor=None model.roi_head.mask_head=None '
            'test_evaluator.metric=bbox')


def add_default_det_tta(cfg: Config) -> None:
    """Gives an mmdet config without ``tta_model``/``tta_pipeline`` mmdet's
    defaults, warning for each (as mmdet's ``tools/test.py``)."""
    if 'tta_model' not in cfg:
        warnings.warn('Cannot find ``tta_model`` in config, we will set it as '
                      'default (DetTTAModel, NMS at IoU 0.5).')
        cfg.tta_model = default_det_tta_model()
    if 'tta_pipeline' not in cfg:
        warnings.warn('Cannot find ``tta_pipeline`` in config, we will set it '
                      'as default (the test pipeline with and without a '
                      'horizontal flip).')
        leaf, _ = next(leaf_datasets(cfg.test_dataloader.dataset,
                                     'test_dataloader.dataset'))
        cfg.tta_pipeline = flip_tta_pipeline(leaf['pipeline'])


def enable_tta(cfg: Config, library: str, config_path: str) -> None:
    """``--tta``: ``cfg.model`` becomes ``cfg.tta_model`` around the model and
    every test dataset reads its images through ``cfg.tta_pipeline``.

    Args:
        cfg (Config): The config, changed in place.
        library (str): ``'mmdet'`` or ``'mmseg'``.
        config_path (str): Named in the messages.

    Raises:
        ValueError: ``library`` is ``'mmengine'``; an mmseg config without
            ``tta_model`` or ``tta_pipeline``; ``DetTTAModel`` on a model with
            a mask head.
    """
    if library == 'mmdet':
        add_default_det_tta(cfg)
        check_det_tta_model(cfg, config_path)
    elif library != 'mmseg':
        raise ValueError(f'--tta is for mmdet and mmseg configs; {config_path} '
                         f"has default_scope='{library}'")
    missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
    if missing:
        raise ValueError(f'--tta needs {" and ".join(missing)} in the config '
                         f"{config_path} (mmseg's bases define them: tta_model in "
                         '_base_/default_runtime.py, tta_pipeline in '
                         '_base_/datasets/*.py)')
    for dataset, _ in leaf_datasets(cfg.test_dataloader.dataset,
                                    'test_dataloader.dataset'):
        dataset['pipeline'] = copy.deepcopy(cfg.tta_pipeline)
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
