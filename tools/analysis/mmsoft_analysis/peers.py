"""Backbones by name, for side-by-side cost comparisons.

A spec is ``NAME`` or ``NAME:key=value,key=value`` (values parsed as Python
literals when possible), e.g. ``soft-small``, ``soft-small:solver=newton``,
``ufo-vit-small``, ``swin-t``, ``pvtv2-b2``, ``pvtv2-b2-li``, ``xcit-s12``;
or the path of an mmdet or mmseg config (``*.py``, options allowed), whose
model's backbone is built as the config builds it with the options set on
it, e.g. ``configs/comparison/mask-rcnn_r18_fpn_demo.py`` or
``configs/demo/mask-rcnn_soft++-tiny_fpn_demo.py:memory_efficient=False``.

The peers: mmdet's Swin-T and PVTv2-b2, and timm's PVTv2-b2-li and XCiT-S12
(through mmpretrain's ``TIMMBackbone``; XCiT-S12 inside
:class:`IsotropicPyramid`, the comparison's wrapper in
``configs/comparison/peer_backbones.py``). timm and mmpretrain are imported
only when one of the latter two is built: they need torchvision, which some
supported environments lack.
"""
import ast
import contextlib
import logging
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch.nn as nn
from mmengine.registry import MODELS

# Importing the module (from the repository root, which the package put on
# sys.path) registers IsotropicPyramid, XCiT's backbone type.
from configs.comparison.peer_backbones import IsotropicPyramid
from mmsoft.apis import build_model_from_config

SOFT_ARCHS = ('tiny', 'small', 'medium', 'large', 'huge')
UFO_ARCHS = ('tiny', 'small', 'medium', 'base')


def _soft(arch: str) -> Callable[..., nn.Module]:
    def build(**kwargs):
        from mmsoft.openmmlab import SOFT
        settings = dict(arch=arch, variant='soft++', solver='newton_closed_form')
        settings.update(kwargs)
        return SOFT(**settings)
    return build


def _ufo_vit(arch: str) -> Callable[..., nn.Module]:
    def build(**kwargs):
        import mmsoft  # noqa: F401
        return MODELS.build(dict(type='UFOViT', arch=arch, **kwargs))
    return build


def _swin_t(**kwargs) -> nn.Module:
    """mmdet's Swin-T as in its Mask R-CNN configs."""
    from mmdet.models.backbones import SwinTransformer
    settings = dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                    window_size=7, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.2,
                    out_indices=(0, 1, 2, 3))
    settings.update(kwargs)
    return SwinTransformer(**settings)


def _pvtv2_b2(**kwargs) -> nn.Module:
    """mmdet's PVTv2-b2."""
    from mmdet.models.backbones import PyramidVisionTransformerV2
    settings = dict(embed_dims=64, num_layers=[3, 4, 6, 3])
    settings.update(kwargs)
    return PyramidVisionTransformerV2(**settings)


# timm 1.0's pvt_v2_b2_li (keys pooled to 7x7: linear cost), four maps at
# strides 4-32; drop-path rate as mmdet's PVTv2 (and the PVTv2 detection
# configs).
PVTV2_B2_LI = dict(model_name='pvt_v2_b2_li', features_only=True,
                   out_indices=(0, 1, 2, 3), drop_path_rate=0.1)
PVTV2_B2_LI_CHANNELS = [64, 128, 320, 512]
# timm's xcit_small_12_p16_224 (no checkpoint: any input size) as in XCiT's
# Mask R-CNN configs (facebookresearch/xcit detection/): the outputs of
# blocks 3, 5, 7 and 11, drop-path rate 0.05 in every block. With
# ``features_only`` timm drops the class-attention blocks and the head.
XCIT_S12_TRUNK = dict(model_name='xcit_small_12_p16_224', features_only=True,
                      out_indices=(3, 5, 7, 11), drop_path_rate=0.05)
XCIT_S12_DIMS = 384


def timm_backbone(**settings) -> nn.Module:
    """mmpretrain's ``TIMMBackbone(**settings)``, without a checkpoint
    (imports timm and mmpretrain)."""
    try:
        from mmpretrain.models.backbones import TIMMBackbone
    except ImportError as error:
        raise ImportError(f"timm's {settings.get('model_name')} needs timm and "
                          f'mmpretrain (and torchvision): {error}') from error
    settings.setdefault('pretrained', False)
    return TIMMBackbone(**settings)


def _pvtv2_b2_li(**kwargs) -> nn.Module:
    """timm's PVTv2-b2-li, four maps (64, 128, 320, 512 channels)."""
    return timm_backbone(**dict(PVTV2_B2_LI, **kwargs))


def _xcit_s12(**kwargs) -> nn.Module:
    """timm's XCiT-S12/16 trunk with XCiT's detection resampling: four maps
    of 384 channels at strides 4-32."""
    return IsotropicPyramid(timm_backbone(**dict(XCIT_S12_TRUNK, **kwargs)),
                            XCIT_S12_DIMS)


BACKBONES: Dict[str, Callable[..., nn.Module]] = {
    **{f'soft-{arch}': _soft(arch) for arch in SOFT_ARCHS},
    **{f'ufo-vit-{arch}': _ufo_vit(arch) for arch in UFO_ARCHS},
    'swin-t': _swin_t,
    'pvtv2-b2': _pvtv2_b2,
    'pvtv2-b2-li': _pvtv2_b2_li,
    'xcit-s12': _xcit_s12,
}


def is_config_spec(spec: str) -> bool:
    """Whether ``spec`` names a config file rather than a backbone."""
    return spec.partition(':')[0].endswith('.py')


def config_backbone(path: str, **overrides) -> nn.Module:
    """The backbone of the model of config ``path`` (mmdet or mmseg), built in
    the config's scope after its ``custom_imports``, without weights, with
    ``overrides`` set in its backbone's settings."""
    from mmengine.config import Config
    config = Config.fromfile(path)
    config.model.backbone.update(overrides)
    return build_model_from_config(config).backbone


def parse_spec(spec: str) -> Tuple[str, dict]:
    """Splits ``NAME:key=value,...`` (``NAME`` a backbone or a config path)
    into the name and keyword arguments.

    Raises:
        FileNotFoundError: When a config path does not exist.
        ValueError: When the name is not known or an option is not
            ``key=value``.
    """
    name, _, options = spec.partition(':')
    if is_config_spec(name):
        if not Path(name).is_file():
            raise FileNotFoundError(f'config {name!r} (a backbone spec ending in '
                                    "'.py') does not exist.")
    elif name not in BACKBONES:
        raise ValueError(f'backbone {name!r} is not known; expected one of '
                         f'{sorted(BACKBONES)} (optionally followed by '
                         f"':key=value,...') or a config path ending in '.py'.")
    kwargs = {}
    for item in filter(None, options.split(',')):
        key, sep, value = item.partition('=')
        if not sep:
            raise ValueError(f'option {item!r} of {spec!r} must be key=value.')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


@contextlib.contextmanager
def quiet_init_info():
    """Drops mmengine's INFO records (warnings pass) while inside: a top-level
    ``BaseModule.init_weights`` logs one record per parameter."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def build_backbone(spec: str) -> nn.Module:
    """The backbone named by ``spec``, initialised, in eval mode."""
    name, kwargs = parse_spec(spec)
    if is_config_spec(name):
        model = config_backbone(name, **kwargs)
    else:
        model = BACKBONES[name](**kwargs)
    with quiet_init_info():
        model.init_weights()
    model.eval()  # some backbones' train() does not return the module
    return model
