# Pieces shared by every UFO-ViT config. They carry no key of the mmdet/mmseg
# bases, so a task config lists this file next to a library base and picks
# them up as `_base_.ufo_backbone`, `_base_.ufo_det_optim_wrapper`, ...
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# Four maps of `embed_dims` channels at strides 4, 8, 16 and 32. The per-size
# configs add `arch`, `drop_path_rate` and `init_cfg`, and set the neck/head
# input channels to [embed_dims] * 4.
ufo_backbone = dict(type='UFOViT', out_indices=(0, 1, 2, 3))

# No weight decay on norm layers (norm_decay_mult), the Fourier position
# encoding's projection (`pos_embed`, as XCiT exempts its `pos_embeder`) or
# the learnable scales matched by 'gamma': the residual layer scales
# `gamma1..3` of every block and the XNorm scales `gamma_q`/`gamma_kv`.
ufo_paramwise_cfg = dict(
    norm_decay_mult=0.,
    custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'gamma': dict(decay_mult=0.),
    })

# AdamW of the libraries' transformer detection configs (Swin, PVT).
ufo_det_optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=ufo_paramwise_cfg)
# AdamW of the libraries' transformer UperNet/SegFormer configs.
ufo_seg_optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=ufo_paramwise_cfg)
