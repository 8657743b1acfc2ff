# UperNet with a UFO-ViT backbone on ADE20K 512x512 crops: mmseg's 160k
# schedule with the AdamW recipe of its Swin/SegFormer configs (linear warmup
# over 1500 iterations, then linear decay). The per-size configs set the
# backbone's arch, drop_path_rate and checkpoint and the heads' in_channels.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py', 'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py',
    './ufo-vit.py'
]
crop_size = (512, 512)
data_preprocessor = dict(type='ValidRegionSegDataPreprocessor', size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    # The base's ResNet-50 weights; the backbone's init_cfg loads its own.
    pretrained=None,
    backbone=dict(_delete_=True, **_base_.ufo_backbone),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))

optim_wrapper = dict(_delete_=True, **_base_.ufo_seg_optim_wrapper)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0., power=1., begin=1500, end=160000,
         by_epoch=False)
]

# 8 GPUs x 2 images.
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
