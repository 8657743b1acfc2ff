# A peer for tools/analysis/compare_backbones.py: the SOFT demo
# (mask-rcnn_soft-tiny_fpn_demo.py) with timm's XCiT-T12/16, the
# cross-covariance transformer UFO-ViT-tiny is shaped like (192 channels, 12
# blocks at stride 16). timm's trunk (through mmpretrain's TIMMBackbone)
# gives the outputs of blocks 3, 5, 7 and 11; XCiT's detection resampling
# (IsotropicPyramid) takes them to strides 4-32, as UFO-ViT's demo config
# does. Stochastic depth 0.05, as in the UFO-ViT-tiny
# demo config. Needs timm, mmpretrain and torchvision. Data, neck, heads,
# schedule, optimiser and seed are the demo's.
_base_ = ['../demo/mask-rcnn_soft-tiny_fpn_demo.py']
# IsotropicPyramid is registered by configs/comparison/peer_backbones.py,
# imported as a module of the repository (as mmdet's projects/ configs import
# theirs): tools/train.py, tools/test.py and tools/analysis/ put the repository
# root on sys.path; other launchers need it there too (PYTHONPATH=.).
custom_imports = dict(imports=['mmsoft', 'configs.comparison.peer_backbones'],
                      allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='IsotropicPyramid',
        trunk=dict(
            type='mmpretrain.TIMMBackbone',
            model_name='xcit_tiny_12_p16_224',
            features_only=True,
            pretrained=False,
            out_indices=(3, 5, 7, 11),
            drop_path_rate=0.05),
        embed_dims=192),
    neck=dict(in_channels=[192] * 4))
