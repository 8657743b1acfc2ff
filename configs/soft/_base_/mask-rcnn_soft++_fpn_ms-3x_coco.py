# Mask R-CNN + FPN with a SOFT++ backbone: mmdet's multi-scale 3x COCO config
# (shorter side 640-800, 36 epochs: 12 epochs over RepeatDataset(times=3),
# LR steps at 27 and 33) with AdamW. The per-size configs set the backbone's
# arch, drop_path_rate and checkpoint.
_base_ = [
    'mmdet::common/ms_3x_coco-instance.py',
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py', './soft++.py'
]

model = dict(
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(_delete_=True, **_base_.soft_backbone),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(_delete_=True, **_base_.soft_det_optim_wrapper)
# 8 GPUs x 2 images.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
