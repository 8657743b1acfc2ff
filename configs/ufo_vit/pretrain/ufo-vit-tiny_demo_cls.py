"""UFO-ViT-T pre-training on the generated shape-classification demo data.

The ImageNet path (``ufo-vit-*_8xb128-300e_in1k.py``) at toy scale, to show
pre-training (mmpretrain's tools) -> ``tools/model_converters/
ufo_vit_cls2backbone.py`` -> detection fine-tuning on a CPU: 64x64 images of
4 shape classes, the same model (UFO-ViT-T + 2 class-attention layers) and
augmentations (RandAugment at magnitude 5 instead of 9), mmpretrain's
``CustomDataset`` on the class folders, batch 32, 8 epochs (104 steps),
EMA with momentum 0.1 (an averaging horizon of about 10 steps; DeiT's 4e-5
is 25,000 of the 375,000 steps of an ImageNet run). It exercises the
mechanics, not accuracy: 104 steps of a transformer from scratch on 400
images leave the validation accuracy near chance (25%; measured 26-29%,
training loss 1.38 ~ ln 4, in 2 minutes on one thread of a 2-core CPU).
Data, training and test::

    python tools/generate_demo_data.py cls
    MMPRETRAIN=$(python -c "import mmpretrain, os; \\
print(os.path.dirname(mmpretrain.__file__))")
    python $MMPRETRAIN/.mim/tools/train.py \\
        configs/ufo_vit/pretrain/ufo-vit-tiny_demo_cls.py
    python $MMPRETRAIN/.mim/tools/test.py \\
        configs/ufo_vit/pretrain/ufo-vit-tiny_demo_cls.py \\
        work_dirs/ufo-vit-tiny_demo_cls/epoch_8.pth
"""
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

num_classes = 4
data_root = 'data/demo_cls/'

data_preprocessor = dict(num_classes=num_classes)
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.05),
    head=dict(num_classes=num_classes, in_channels=192, num_heads=4))

# The pipeline works on BGR images: pad and fill values are in BGR order.
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.35, 1.0),
         backend='pillow', interpolation='bicubic'),
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
    dict(type='ResizeEdge', scale=64, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
# Labels from the class folders (sorted names: circle, square, star,
# triangle), as generate_classification_demo writes them.
train_dataloader = dict(
    batch_size=32,
    num_workers=1,
    persistent_workers=True,
    pin_memory=False,
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root,
                 data_prefix='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=50,
    num_workers=1,
    persistent_workers=True,
    pin_memory=False,
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root,
                 data_prefix='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
# 4 classes: top-5 accuracy does not exist.
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator

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
custom_hooks = [dict(type='EMAHook', momentum=0.1, priority='ABOVE_NORMAL')]
randomness = dict(seed=0)
