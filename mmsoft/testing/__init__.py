"""Helpers for tests and examples: dense-prediction models around a backbone."""
from .dense_models import (backbone_grad_norm, build_mask_rcnn, build_upernet,
                           demo_seg_inputs,
                           detector_train_step, segmentor_train_step)

__all__ = [
    'backbone_grad_norm',
    'build_mask_rcnn', 'build_upernet', 'demo_seg_inputs', 'detector_train_step',
    'segmentor_train_step'
]
