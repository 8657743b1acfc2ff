# A peer for tools/analysis/compare_backbones.py: the SOFT demo
# (mask-rcnn_soft-tiny_fpn_demo.py) with mmdet's Swin Transformer at
# two-thirds of Swin-T's width, so that its parameter count (12.2 M) is
# SOFT++-tiny's (12.6 M): 64/128/256/512 channels, Swin-T's depths 2-2-6-2
# and head width 32; not a published variant. Windows of 5x5, not Swin-T's
# 7x7: at the demo's 160x160 the four maps are 40/20/10/5 pixels wide,
# which 5 divides; with 7, stages 3 and 4 (8 of the 12 blocks) run on maps
# padded to 14x14 and 7x7, about half of each window zero padding. Neither
# window size makes this Swin learn in the comparison's 225 iterations
# (docs/comparison.md, "The probe"). From scratch: no pretrained weights,
# no stochastic depth, like the demo's backbone. Data, neck, heads,
# optimiser and seed are the demo's; the comparison trains it with its
# probe's recipe (lr 3e-4, one-epoch warm-up).
_base_ = ['../demo/mask-rcnn_soft-tiny_fpn_demo.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='SwinTransformer',
        embed_dims=64,
        depths=[2, 2, 6, 2],
        num_heads=[2, 4, 8, 16],
        window_size=5,
        mlp_ratio=4,
        qkv_bias=True,
        drop_path_rate=0.0,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
