"""Generators of the demo data, beside ``tools/generate_demo_data.py``: COCO
instance segmentation, ADE20K-layout semantic segmentation and an
ImageNet-layout classification set of random shape scenes, written to disk
so that the libraries' own dataset classes read them."""
from .scenes import DEFAULT_CLASSES, SHAPES, render_scene
from .ade import ade_metainfo, generate_ade_demo
from .classification import generate_classification_demo
from .coco import coco_metainfo, generate_coco_demo

__all__ = [
    'DEFAULT_CLASSES', 'SHAPES', 'render_scene', 'generate_coco_demo',
    'generate_ade_demo', 'generate_classification_demo', 'coco_metainfo',
    'ade_metainfo'
]
