# Pieces shared by every SOFT++ config. They carry no key of the mmdet/mmseg
# bases, so a task config lists this file next to a library base and picks
# them up as `_base_.soft_backbone`, `_base_.soft_det_optim_wrapper`, ...
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# SOFT++ (symmetric-normalised kernel attention, the variant of the published
# COCO/ADE20K models). The per-size configs add `arch`, `drop_path_rate` and
# `init_cfg` (the converted ImageNet checkpoint).
soft_backbone = dict(
    type='SOFT',
    variant='soft++',
    # The function every published SOFT++ checkpoint was trained with: 20
    # Newton-Raphson steps towards the pseudo-inverse of the bottleneck
    # kernel. The layer decides per device at run time how to compute it: on
    # the CPU in closed form from one eigendecomposition (at about the exact
    # solver's cost), on other devices (GPUs) by the iteration itself, the
    # same function. The exact pseudo-inverse (solver='exact') is a different
    # function wherever the kernel is ill-conditioned, as it is at detection
    # resolution.
    solver='newton_closed_form',
    newton_iters=20,
    # Bottleneck tokens per attention. Every COCO image, in training (shorter
    # side 640-800) and in testing (1333x800), has more (e.g. a 25x42 = 1050
    # grid at 1333x800) and is average-pooled to at most 256 (12x20 = 240);
    # an ADE20K crop or sliding window of 512x512 has exactly 256 (16x16) and
    # is never pooled. So training and testing pool alike.
    max_bottleneck_tokens=256,
    out_indices=(0, 1, 2, 3))

# No weight decay on norm layers (norm_decay_mult), the learned position
# embeddings or the class token.
soft_paramwise_cfg = dict(
    norm_decay_mult=0.,
    custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'cls_token': dict(decay_mult=0.),
    })

# AdamW of the libraries' transformer detection configs (Swin, PVT).
soft_det_optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=soft_paramwise_cfg)
# AdamW of the libraries' transformer UperNet/SegFormer configs.
soft_seg_optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=soft_paramwise_cfg)
