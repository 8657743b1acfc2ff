"""Generators of the demo data: COCO instance segmentation and ADE20K-layout
semantic segmentation of random shape scenes, written to disk so that the
libraries' own dataset classes read them."""
from .scenes import DEFAULT_CLASSES, SHAPES, render_scene
from .ade_generator import ade_metainfo, generate_ade_demo
from .coco_generator import coco_metainfo, generate_coco_demo

__all__ = [
    'DEFAULT_CLASSES', 'SHAPES', 'render_scene', 'generate_coco_demo',
    'generate_ade_demo', 'coco_metainfo', 'ade_metainfo'
]
