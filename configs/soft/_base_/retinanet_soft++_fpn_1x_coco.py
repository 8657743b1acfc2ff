# RetinaNet + FPN with a SOFT++ backbone: mmdet's 1x COCO config with AdamW.
# As in mmdet's PVT configs, the FPN takes the stride-8/16/32 maps
# (start_level=1 of the base) and adds P6/P7 on the last input map.
# The per-size configs set the backbone's arch, drop_path_rate and checkpoint.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', './soft++.py']

model = dict(
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(_delete_=True, **_base_.soft_backbone),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(_delete_=True, **_base_.soft_det_optim_wrapper)
# 8 GPUs x 2 images.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
