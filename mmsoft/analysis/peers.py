"""Backbones by name, for side-by-side cost comparisons.

A spec is ``NAME`` or ``NAME:key=value,key=value`` (values parsed as Python
literals when possible), e.g. ``soft-small``, ``soft-small:solver=newton``,
``ufo-vit-small``, ``swin-t``, ``pvtv2-b2``.
"""
import ast
from typing import Callable, Dict, Tuple

import torch.nn as nn

SOFT_ARCHS = ('tiny', 'small', 'medium', 'large', 'huge')
UFO_ARCHS = ('tiny', 'small', 'medium', 'base')


def _soft(arch: str) -> Callable[..., nn.Module]:
    def build(**kwargs):
        from ..models.backbones import SOFT
        settings = dict(arch=arch, attention='soft++', solver='newton_closed_form')
        settings.update(kwargs)
        return SOFT(**settings)
    return build


def _ufo_vit(arch: str) -> Callable[..., nn.Module]:
    def build(**kwargs):
        from mmengine.registry import MODELS
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


BACKBONES: Dict[str, Callable[..., nn.Module]] = {
    **{f'soft-{arch}': _soft(arch) for arch in SOFT_ARCHS},
    **{f'ufo-vit-{arch}': _ufo_vit(arch) for arch in UFO_ARCHS},
    'swin-t': _swin_t,
    'pvtv2-b2': _pvtv2_b2,
}


def parse_spec(spec: str) -> Tuple[str, dict]:
    """Splits ``NAME:key=value,...`` into the name and keyword arguments."""
    name, _, options = spec.partition(':')
    if name not in BACKBONES:
        raise ValueError(f'backbone {name!r} is not known; expected one of '
                         f'{sorted(BACKBONES)} (optionally followed by '
                         f"':key=value,...').")
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


def build_backbone(spec: str) -> nn.Module:
    """The backbone named by ``spec``, initialised, in eval mode."""
    name, kwargs = parse_spec(spec)
    model = BACKBONES[name](**kwargs)
    model.init_weights()
    model.eval()  # some backbones' train() does not return the module
    return model
