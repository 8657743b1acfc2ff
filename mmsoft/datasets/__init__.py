"""Generated demo datasets: COCO instance segmentation and ADE20K-layout
semantic segmentation of random shape scenes."""
from .scenes import DEFAULT_CLASSES, SHAPES, render_scene
from .synthetic_ade import ade_metainfo, generate_ade_demo
from .synthetic_classification import generate_classification_demo
from .synthetic_coco import coco_metainfo, generate_coco_demo

__all__ = [
    'DEFAULT_CLASSES', 'SHAPES', 'render_scene', 'generate_coco_demo',
    'generate_ade_demo', 'coco_metainfo', 'ade_metainfo',
    'generate_classification_demo'
]
