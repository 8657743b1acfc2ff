# mask-rcnn_soft-tiny_fpn_demo-mixed.py with mmdet's plain data preprocessor:
# the backbone is not told the images' valid regions, so padded pixels enter
# its attention and its position embeddings are stretched over the padded
# canvas. Every other setting is identical; the pair measures what
# valid-region awareness is worth on batches that pad.
_base_ = ['./mask-rcnn_soft-tiny_fpn_demo-mixed.py']

model = dict(data_preprocessor=dict(type='DetDataPreprocessor'))
