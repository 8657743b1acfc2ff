# ImageNet-1k pre-training of a UFO-ViT backbone with the DeiT recipe
# (Touvron et al. 2021), on mmengine's Runner. The per-size configs set the
# backbone's arch and drop_path_rate and the head's in_channels/num_heads.
#
# Model: BackboneClassifier = UFOViT (last block only, out_indices=(3, ),
# its 2x2 max-pool skipped so the head reads every stride-16 token) +
# ClassAttentionHead (2 class-attention layers, as in XCiT, which UFO-ViT
# builds on). Only `backbone.*` is kept for detection/segmentation:
# tools/model_converters/ufo_vit_cls2backbone.py.
#
# Recipe: 300 epochs, AdamW (lr 5e-4 x batch / 512, weight decay 0.05, none
# on norms, biases, 1-d parameters, position encoding and layer scales),
# 5 linear warm-up epochs from 1e-6, cosine decay to 1e-5; RandomResizedCrop
# 224 (bicubic), horizontal flip, RandAugment rand-m9-mstd0.5-inc1, random
# erasing 0.25 (pixel noise N(mean, std), before normalisation), Mixup 0.8 /
# CutMix 1.0 (switch 0.5), label smoothing 0.1.
# Evaluation: resize to 256 (shorter side, bicubic), centre crop 224.
# Not included from DeiT: repeated augmentation and model EMA.
#
# The transforms, data preprocessor, dataset, metric and loss carry
# mmpretrain 1.x's names and arguments (mmsoft.pretrain registers them in
# mmengine's root registries); with mmpretrain, default_scope='mmpretrain'
# builds its own classes from the same dicts, except BackboneClassifier and
# ClassAttentionHead (mmsoft's) and the 1000 ImageNet class names (here the
# folder names or classes=...).
#
# Data (the OpenMMLab ImageNet layout):
#   data/imagenet/train/n01440764/*.JPEG ...
#   data/imagenet/val/*.JPEG (or val/<wnid>/*.JPEG)
#   data/imagenet/meta/train.txt, meta/val.txt ("<relative path> <label>")
# Without the meta files, remove ann_file: the class folders are scanned.
#
# mmpretrain is not used: mmpretrain 1.2.0 installs beside the pinned
# mmcv/mmengine/torch, but its models and transforms import torchvision, and
# the only torchvision builds on the package index for torch 2.13 are CUDA
# builds that fail to import against the CPU torch; an unpinned torchvision
# replaces torch by a CUDA build.
default_scope = 'mmengine'
custom_imports = dict(imports=['mmsoft', 'mmsoft.pretrain'],
                      allow_failed_imports=False)

model = dict(
    type='BackboneClassifier',
    data_preprocessor=dict(
        type='ClsDataPreprocessor',
        num_classes=1000,
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        to_rgb=True,
        batch_augments=dict(augments=[
            dict(type='Mixup', alpha=0.8),
            dict(type='CutMix', alpha=1.0)
        ])),
    backbone=dict(type='UFOViT', arch='small', out_indices=(3, ),
                  drop_path_rate=0.1),
    skip_final_pool=True,
    head=dict(
        type='ClassAttentionHead',
        num_classes=1000,
        in_channels=304,
        num_layers=2,
        num_heads=8,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')))

# ------------------------------------------------------------------- data ---
data_root = 'data/imagenet/'
# The pipeline works on BGR images: pad and fill values are in BGR order.
bgr_mean = [103.53, 116.28, 123.675]
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, crop_ratio_range=(0.08, 1.0),
         backend='cv2', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2,
         total_level=10, magnitude_level=9, magnitude_std=0.5,
         hparams=dict(pad_val=[round(x) for x in bgr_mean],
                      interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
         max_area_ratio=1 / 3, fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='cv2',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=128,
    num_workers=10,
    persistent_workers=True,
    pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix=dict(img_path='train'),
        ann_file='meta/train.txt',
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=128,
    num_workers=10,
    persistent_workers=True,
    pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix=dict(img_path='val'),
        ann_file='meta/val.txt',
        test_mode=True,
        pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

# --------------------------------------------------------------- schedule ---
# 8 GPUs x 128 images: lr = 5e-4 * 1024 / 512.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, betas=(0.9, 0.999),
                   eps=1e-8, weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        flat_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'gamma': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=295, eta_min=1e-5, by_epoch=True,
         begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=300, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
# --auto-scale-lr (or auto_scale_lr.enable=True) rescales lr to other totals.
auto_scale_lr = dict(enable=False, base_batch_size=1024)

# ----------------------------------------------------------------- runtime ---
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3,
                    save_best='accuracy/top1', rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'))
env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))
log_processor = dict(by_epoch=True, window_size=50)
visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=None, deterministic=False)
