# ImageNet-1k pre-training of a UFO-ViT backbone with the DeiT recipe
# (Touvron et al. 2021), as an mmpretrain config: train and test it with
# mmpretrain's tools (mmpretrain/.mim/tools/train.py, test.py, dist_train.sh,
# or `mim train mmpretrain CONFIG`). The per-size configs set the backbone's
# arch and drop_path_rate and the head's in_channels/num_heads. 8 GPUs x 128
# images, then the backbone checkpoint for detection and segmentation:
#   MMPRETRAIN=$(python -c "import mmpretrain, os; print(os.path.dirname(mmpretrain.__file__))")
#   bash $MMPRETRAIN/.mim/tools/dist_train.sh configs/ufo_vit/pretrain/ufo-vit-small_8xb128-300e_in1k.py 8
#   python tools/model_converters/ufo_vit_cls2backbone.py \
#       work_dirs/ufo-vit-small_8xb128-300e_in1k/best_accuracy_top1_epoch_N.pth \
#       pretrained/ufo-vit-small_in1k.pth
#
# Model: mmpretrain's ImageClassifier = UFOViTStride16 (UFOViT's last block,
# its tokens at stride 16 without UFOViT's final 2x2 max-pool, so the head
# reads every token) + UFOViTClassAttentionHead (2 class-attention layers, as in
# XCiT, which UFO-ViT builds on). Both come from mmsoft.pretrain (registered
# in mmpretrain's MODELS); everything else is mmpretrain's. Only `backbone.*`
# is kept for detection/segmentation:
# tools/model_converters/ufo_vit_cls2backbone.py.
#
# Recipe: 300 epochs, AdamW (lr 5e-4 x batch / 512, weight decay 0.05, none
# on norms, biases, 1-d parameters, position encoding and layer scales),
# 5 linear warm-up epochs from 1e-6, cosine decay to 1e-5 (both per
# iteration); RandomResizedCrop 224 (bicubic), horizontal flip, RandAugment
# rand-m9-mstd0.5-inc1, random erasing 0.25 (pixel noise N(mean, std), before
# normalisation), Mixup 0.8 / CutMix 1.0 (one of them per batch, each with
# probability 0.5), label smoothing 0.1, model EMA (decay 0.99996: EMAHook
# momentum 4e-5; validation, test and the saved state_dict use the EMA
# weights). Evaluation: resize to 256 (shorter side, bicubic), centre crop
# 224, top-1/top-5 accuracy.
# Not included from DeiT: repeated augmentation (mmpretrain's
# `sampler=dict(type='RepeatAugSampler')` adds it).
#
# Data (mmpretrain's ImageNet layout):
#   data/imagenet/train/n01440764/*.JPEG ...
#   data/imagenet/val/*.JPEG (or val/<wnid>/*.JPEG)
#   data/imagenet/meta/train.txt, meta/val.txt ("<relative path> <label>")
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]

# UFOViT (mmsoft, mmengine's root MODELS) and UFOViTStride16 /
# UFOViTClassAttentionHead (mmsoft.pretrain, mmpretrain's MODELS).
custom_imports = dict(imports=['mmsoft', 'mmsoft.pretrain'],
                      allow_failed_imports=False)

# ------------------------------------------------------------------ model ---
# The data preprocessor (normalisation, BGR -> RGB) is the datasets base's
# `data_preprocessor`; Mixup/CutMix are its batch augments (train_cfg).
model = dict(
    type='ImageClassifier',
    backbone=dict(type='UFOViTStride16', arch='small', drop_path_rate=0.1),
    neck=None,
    head=dict(
        type='UFOViTClassAttentionHead',
        num_classes=1000,
        in_channels=304,
        num_layers=2,
        num_heads=8,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')),
    train_cfg=dict(augments=[
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0),
    ]))

# ------------------------------------------------------------------- data ---
# Pipelines, dataset (ImageNet, data/imagenet) and Accuracy(topk=(1, 5)):
# the datasets base. 8 GPUs x 128 images.
train_dataloader = dict(batch_size=128, num_workers=10)
val_dataloader = dict(batch_size=128, num_workers=10)
test_dataloader = val_dataloader

# --------------------------------------------------------------- schedule ---
# 8 GPUs x 128 images: lr = 5e-4 * 1024 / 512 (the schedules base);
# --auto-scale-lr rescales it to other totals (auto_scale_lr: 1024).
optim_wrapper = dict(
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        flat_decay_mult=0.,
        custom_keys=dict(
            _delete_=True,
            pos_embed=dict(decay_mult=0.),
            gamma=dict(decay_mult=0.),
            cls_token=dict(decay_mult=0.))))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=295, eta_min=1e-5, by_epoch=True,
         begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

# ----------------------------------------------------------------- runtime ---
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3,
                    save_best='accuracy/top1', rule='greater'))
custom_hooks = [dict(type='EMAHook', momentum=4e-5, priority='ABOVE_NORMAL')]
