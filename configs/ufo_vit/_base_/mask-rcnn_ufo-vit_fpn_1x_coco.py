# Mask R-CNN + FPN with a UFO-ViT backbone: mmdet's 1x COCO config (12 epochs,
# LR steps at 8 and 11) with AdamW. The per-size configs set the backbone's
# arch, drop_path_rate and checkpoint and the FPN's in_channels.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './ufo-vit.py']

model = dict(
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(_delete_=True, **_base_.ufo_backbone))

optim_wrapper = dict(_delete_=True, **_base_.ufo_det_optim_wrapper)
# 8 GPUs x 2 images.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
