# The SOFT Mask R-CNN demo on images of mixed sizes and aspect ratios
# (python tools/generate_demo_data.py coco --mixed-sizes ->
# data/demo_coco_mixed/: sides 96-192 pixels, aspect ratios 1:2 to 2:1).
# Images are resized to fit 192x192 with their aspect ratio kept, so a batch
# holds landscape and portrait images and is padded to its largest height and
# width (rounded up to 32). The backbone is told each image's valid region by
# the inherited ValidRegionDetDataPreprocessor;
# mask-rcnn_soft-tiny_fpn_demo-mixed-no-valid-region.py is the same model
# without it. Model, schedule and seed are those of the 160x160 demo.
_base_ = ['./mask-rcnn_soft-tiny_fpn_demo.py']

data_root = 'data/demo_coco_mixed/'
img_scale = (192, 192)

train_pipeline = _base_.train_pipeline
train_pipeline[2].scale = img_scale  # Resize, keep_ratio=True
test_pipeline = _base_.test_pipeline
test_pipeline[1].scale = img_scale  # Resize, keep_ratio=True

train_dataloader = dict(
    dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
