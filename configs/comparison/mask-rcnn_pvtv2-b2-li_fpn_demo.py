# A peer for tools/analysis/compare_backbones.py: the SOFT demo
# (mask-rcnn_soft-tiny_fpn_demo.py) with timm's PVTv2-b2-li (keys pooled to
# 7x7, so linear in the pixel count) through mmpretrain's TIMMBackbone:
# four maps of 64/128/320/512 channels at strides 4-32. From scratch: no
# pretrained weights, no stochastic depth. Needs timm, mmpretrain and
# torchvision (requirements/runtime.txt). Data, neck, heads, optimiser and
# seed are the demo's; the comparison trains it with its probe's recipe
# (one-epoch warm-up): it learns little either way, where mmdet's PVTv2 at
# the same depths learns (docs/comparison.md, "The probe").
_base_ = ['../demo/mask-rcnn_soft-tiny_fpn_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.TIMMBackbone',
        model_name='pvt_v2_b2_li',
        features_only=True,
        pretrained=False,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0),
    neck=dict(in_channels=[64, 128, 320, 512]))
