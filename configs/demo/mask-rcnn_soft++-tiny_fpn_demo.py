# The SOFT demo (mask-rcnn_soft-tiny_fpn_demo.py) with SOFT-tiny at its full
# widths: 64/128/320/512 channels, depths 1-2-3-2, SOFT++ attention, exact
# pseudo-inverse, no stochastic depth. Everything else (data, neck, heads,
# schedule, optimiser, seed) is the demo's. One of the backbones that
# tools/analysis/compare_backbones.py trains side by side.
_base_ = ['./mask-rcnn_soft-tiny_fpn_demo.py']

backbone_dims = [64, 128, 320, 512]
model = dict(
    backbone=dict(arch='tiny'),
    neck=dict(in_channels=backbone_dims))
