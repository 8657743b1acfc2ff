"""Helpers for tests and examples.

:mod:`.host_syncs` and :mod:`.dataset_digest` need only torch (and numpy);
:mod:`.dense_models` (Mask R-CNN and UperNet around a backbone) needs mmdet
and mmseg, and is imported when one of its names is first used.
"""
import importlib

_DENSE_MODELS = ('backbone_grad_norm', 'build_mask_rcnn', 'build_upernet',
                 'demo_seg_inputs', 'detector_train_step', 'segmentor_train_step')


def __getattr__(name: str):
    if name in _DENSE_MODELS:
        return getattr(importlib.import_module(f'{__name__}.dense_models'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = list(_DENSE_MODELS)
