# UperNet with a SOFT-tiny backbone on the generated ADE20K-layout shapes
# dataset (python tools/generate_demo_data.py ade -> data/demo_ade/), trained
# from scratch on a 2-core CPU in minutes (10 min 00 s for the whole training
# run on 29 November, docs/get_started.md). mmseg's UperNet (R-50,
# ADE20K, 80k) is inherited; only the data (5 classes: background and 4
# shapes, ADE20K's reduce_zero_label encoding), the image size, BN instead of
# SyncBN, the widths, the loss weights and the schedule change. The backbone
# is the Mask R-CNN demo's: SOFT-tiny's layout (depths 1-2-3-2, SOFT++,
# exact pseudo-inverse) at half its widths, without stochastic depth.
#
# Two choices make it learn within the budget (README, 'What make demo does'):
# - The decode head has no normalisation layers (norm_cfg=None). With BN in
#   UperNet's 32-channel head, training stayed at (or near) the
#   all-background solution for 1100-1200 iterations; on frozen features of
#   the trained demo detector's backbone a BN or GN head did too, where the
#   same head without normalisation learned.
# - Background (84% of the pixels) is down-weighted in the cross-entropy.
#   mmseg 1.2's class-weighted loss cannot take the ignore label 255, so the
#   training crops never need padding: images are only enlarged
#   (ratio_range >= 1, keep_ratio=False) before the 160x160 crop.
_base_ = ['mmseg::upernet/upernet_r50_4xb4-80k_ade20k-512x512.py']
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

data_root = 'data/demo_ade/'
metainfo = dict(
    classes=('background', 'circle', 'triangle', 'square', 'star'),
    palette=[[0, 0, 0], [220, 20, 60], [0, 130, 200], [60, 180, 75],
             [255, 160, 0]])
num_classes = 5
crop_size = (160, 160)
norm_cfg = dict(type='BN', requires_grad=True)
batch_size = 8
max_iters = 1100
val_interval = max_iters // 4
# Background, circle, triangle, square, star.
class_weight = [0.2, 1.0, 1.0, 1.0, 1.0]
weighted_ce = dict(
    type='CrossEntropyLoss',
    use_sigmoid=False,
    class_weight=class_weight,
    avg_non_ignore=True)
backbone_dims = [32, 64, 160, 256]

model = dict(
    data_preprocessor=dict(type='ValidRegionSegDataPreprocessor', size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch=dict(embed_dims=backbone_dims, num_heads=[1, 2, 5, 8],
                  depths=[1, 2, 3, 2], stem_channels=16),
        variant='soft++',
        solver='exact',
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    decode_head=dict(
        in_channels=backbone_dims,
        channels=32,
        num_classes=num_classes,
        norm_cfg=None,
        loss_decode=dict(**weighted_ce, loss_weight=1.0)),
    auxiliary_head=dict(
        in_channels=backbone_dims[2],
        channels=32,
        num_classes=num_classes,
        norm_cfg=norm_cfg,
        loss_decode=dict(**weighted_ce, loss_weight=0.4)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=crop_size, ratio_range=(1.0, 1.5),
         keep_ratio=False),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
seg_dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    metainfo=metainfo,
    reduce_zero_label=True,
    img_suffix='.jpg',
    seg_map_suffix='.png')
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=1,
    persistent_workers=True,
    dataset=dict(
        **seg_dataset,
        data_prefix=dict(img_path='images/training',
                         seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=batch_size,
    num_workers=1,
    persistent_workers=True,
    dataset=dict(
        **seg_dataset,
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=val_interval)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=10.0, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=1e-6, power=1.0, begin=50, end=max_iters,
         by_epoch=False),
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=val_interval, max_keep_ckpts=2))
# The figures in the README come from this seed.
randomness = dict(seed=0)
