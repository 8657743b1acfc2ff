"""UFO-ViT-T pre-training on the generated shape-classification demo data.

The ImageNet path (``ufo-vit-*_8xb128-300e_in1k.py``) at toy scale, to show
pre-training -> ``tools/model_converters/ufo_vit_cls2backbone.py`` ->
detection fine-tuning on a CPU: 64x64 images of 4 shape classes, the same
model (UFO-ViT-T + 2 class-attention layers) and augmentations (RandAugment
at magnitude 5 instead of 9), batch 32, 8 epochs (about 2.5 minutes on
2 CPU cores). It exercises the mechanics, not accuracy: 104 steps of a
transformer from scratch on 400 images leave the validation accuracy near
chance (25%); the training loss only starts to fall below ln(4). Data::

    python -c "from mmsoft.pretrain.demo_data import \
generate_classification_demo as g; g('data/demo_cls')"
"""
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

num_classes = 4
data_root = 'data/demo_cls/'

model = dict(
    data_preprocessor=dict(num_classes=num_classes),
    backbone=dict(arch='tiny', drop_path_rate=0.05),
    head=dict(num_classes=num_classes, in_channels=192, num_heads=4))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.35, 1.0),
         backend='cv2', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2,
         total_level=10, magnitude_level=5, magnitude_std=0.5,
         hparams=dict(pad_val=[104, 116, 124], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
         max_area_ratio=1 / 3, fill_color=[103.53, 116.28, 123.675],
         fill_std=[57.375, 57.12, 58.395]),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=64, edge='short', backend='cv2',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=32,
    num_workers=1,
    persistent_workers=True,
    pin_memory=False,
    dataset=dict(data_root=data_root, classes='meta/classes.txt',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=50,
    num_workers=1,
    persistent_workers=True,
    pin_memory=False,
    dataset=dict(data_root=data_root, classes='meta/classes.txt',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=7, eta_min=1e-5, by_epoch=True,
         begin=1, end=8, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=8, val_interval=2)
auto_scale_lr = dict(base_batch_size=32)

default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(interval=2, max_keep_ckpts=1))
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
