# UperNet with a SOFT-tiny backbone on the generated ADE20K-layout shapes
# dataset (python tools/generate_demo_data.py ade -> data/demo_ade/), trained
# from scratch on a 2-core CPU. mmseg's UperNet (R-50, ADE20K, 80k) is
# inherited; only the data (5 classes: background and 4 shapes, ADE20K's
# reduce_zero_label encoding), the image size, BN instead of SyncBN, the
# widths and the schedule change. The backbone is the Mask R-CNN demo's:
# SOFT-tiny's layout (depths 1-2-3-2, SOFT++, Cholesky solver) at half its
# widths, without stochastic depth (trained from scratch).
# Known limit: 600 iterations are not yet enough to leave the all-background
# solution on this data (mIoU 16.8, README 'What make demo does').
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
max_iters = 600
backbone_dims = [32, 64, 160, 256]

model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch=dict(embed_dims=backbone_dims, num_heads=[1, 2, 5, 8],
                  depths=[1, 2, 3, 2], stem_channels=16),
        attention='soft++',
        solver='cholesky',
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    decode_head=dict(
        in_channels=backbone_dims,
        channels=64,
        num_classes=num_classes,
        norm_cfg=norm_cfg),
    auxiliary_head=dict(
        in_channels=backbone_dims[2],
        channels=32,
        num_classes=num_classes,
        norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.75, 1.5),
         keep_ratio=True),
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
                 val_interval=max_iters)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=10.0, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=1e-6, power=1.0, begin=50, end=max_iters,
         by_epoch=False),
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=max_iters // 2, max_keep_ckpts=2))
# The figures in the README come from this seed.
randomness = dict(seed=0)
# gloo: distributed runs on CPU (tools/dist_train.sh CONFIG 2).
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
