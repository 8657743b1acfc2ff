"""UFO-ViT-S ImageNet-1k pre-training, DeiT recipe, on mmengine's Runner.

Why not mmpretrain: mmpretrain 1.2.0 itself installs beside the pinned
mmcv 2.1.0 / mmengine 0.10.7 / torch 2.13 (CPU) without changing them, but
``mmpretrain.models`` and its transforms import torchvision at module level.
The torchvision build on the package index for torch 2.13 (0.28.0) links CUDA
libraries and fails to import against the CPU torch; an unpinned torchvision
pulls torch 2.14 with CUDA. So the classifier, head, data pipeline and metric
are mmsoft's own (``mmsoft.pretrain``), under mmpretrain's names and arguments
where mmpretrain has an equivalent, registered in mmengine's root registries
(``default_scope = 'mmengine'``).

Recipe and model: ``_base_/ufo-vit_8xb128-300e_in1k.py``. 8 GPUs x 128
images. The backbone checkpoint for the detection configs::

    python tools/model_converters/ufo_vit_cls2backbone.py \
        work_dirs/ufo-vit-small_8xb128-300e_in1k/best_accuracy_top1_epoch_N.pth \
        pretrained/ufo-vit-small_in1k.pth
"""
_base_ = './_base_/ufo-vit_8xb128-300e_in1k.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.1),
    head=dict(in_channels=304, num_heads=8))
