"""timm adapter: every size of SOFT, SOFT++ and UFO-ViT in timm's registry.

``timm.create_model('soft_plus_plus_tiny')`` builds an ImageNet classifier;
``features_only=True, out_indices=...`` the multi-scale maps (strides 4, 8,
16, 32) through ``forward_intermediates``, which transformers'
``TimmBackbone`` also uses. ``pretrained=True, pretrained_cfg_overlay=
dict(file=PATH)`` loads a local file: an official SOFT checkpoint is
converted by :func:`mmsoft.models.soft.checkpoint_filter_fn`. No weights are
hosted, so nothing is downloaded.
"""
from contextlib import nullcontext
from typing import Callable

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import (build_model_with_cfg, generate_default_cfgs, register_model,
                         register_notrace_function, register_notrace_module)
from timm.models._features import FeatureGetterNet  # not exported by timm.models

from .models import soft, ufo_vit
from .models.common import (ConvPatchEmbed, check_image_batch, mask_map, take_indices,
                            tokens_as_map, tokens_to_map)

SOFT_SIZES = ('tiny', 'small', 'medium', 'large', 'huge')
UFO_VIT_SIZES = ('tiny', 'small', 'medium', 'base')
#: Feature maps of every model (strides 4, 8, 16, 32).
NUM_OUTPUTS = 4
#: timm name prefix -> SOFT variant.
SOFT_NAMES = {'soft': 'soft', 'soft_plus_plus': 'soft++'}


# Leaves of timm's torch.fx feature extraction: inside them input checks,
# grids of Python ints, the device and the autocast state steer control flow.
for _function in (check_image_batch, tokens_as_map, tokens_to_map, mask_map):
    register_notrace_function(_function)
for _module in (ConvPatchEmbed, soft.SoftStage, ufo_vit.FourierPositionEncoding,
                ufo_vit.UFOBlock, ufo_vit.ClassAttentionBlock):
    register_notrace_module(_module)
del _function, _module


class CheckpointingFeatureGetterNet(FeatureGetterNet):
    """timm's ``'getter'`` feature wrapper (``forward_intermediates``) with
    ``set_grad_checkpointing``, as timm's hook and list wrappers have it."""

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.model.set_grad_checkpointing(enable)


def _cfg(first_conv: str, **kwargs) -> dict:
    return dict(url='', num_classes=1000, input_size=(3, 224, 224),
                min_input_size=(3, 32, 32), pool_size=None, crop_pct=0.9,
                interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN,
                std=IMAGENET_DEFAULT_STD, first_conv=first_conv, classifier='head',
                fixed_input_size=False, **kwargs)


default_cfgs = generate_default_cfgs({
    **{f'{prefix}_{size}': _cfg('stages.0.patch_embed.proj.0')
       for prefix in SOFT_NAMES for size in SOFT_SIZES},
    **{f'ufo_vit_{size}': _cfg('patch_embed.proj.0') for size in UFO_VIT_SIZES},
})


def _taking_in_chans(model_cls: type, **fixed) -> Callable:
    """``model_cls`` called with timm's ``in_chans`` as ``in_channels`` and
    the arguments ``fixed`` (those named like ``build_model_with_cfg``'s),
    built on timm's ``device`` and cast to its ``dtype``."""
    def build(in_chans: int = 3, device=None, dtype=None, **kwargs):
        with torch.device(device) if device is not None else nullcontext():
            model = model_cls(in_channels=in_chans, **fixed, **kwargs)
        model.in_chans = in_chans
        return model if dtype is None else model.to(dtype=dtype)
    build.__name__ = model_cls.__name__
    return build


def _create(model_cls: type, name: str, pretrained: bool = False, fixed: dict = None,
            **kwargs):
    out_indices = kwargs.pop('out_indices', (0, 1, 2, 3))
    output_stride = kwargs.pop('output_stride', None)
    if output_stride not in (None, 32):
        raise ValueError(f'output_stride={output_stride!r} is not supported by '
                         f'{name}, which has no dilated mode; expected 32 (the '
                         f'default) or None.')
    fixed = dict(fixed or {})
    if model_cls is ufo_vit.UFOViT:
        # The feature pyramid only where its maps are asked for, and only
        # the branches of those maps (build_model_with_cfg keeps
        # out_indices for the feature wrapper: the model gets them here,
        # resolved as the wrapper resolves them: an int n is the last n).
        multi_scale = kwargs.get('features_only', False)
        kwargs.setdefault('multi_scale', multi_scale)
        kwargs.setdefault('global_pool', 'token')
        if multi_scale:
            fixed.setdefault('out_indices',
                             tuple(take_indices(out_indices, NUM_OUTPUTS)))
    filter_fn = soft.checkpoint_filter_fn if model_cls is soft.SOFT else None
    return build_model_with_cfg(
        _taking_in_chans(model_cls, **fixed), name, pretrained,
        pretrained_filter_fn=filter_fn,
        feature_cfg=dict(out_indices=out_indices,
                         feature_cls=CheckpointingFeatureGetterNet), **kwargs)


def _soft(prefix: str, size: str, pretrained: bool, kwargs: dict):
    return _create(soft.SOFT, f'{prefix}_{size}', pretrained,
                   fixed=dict(variant=SOFT_NAMES[prefix]), arch=size, **kwargs)


def _ufo_vit(size: str, pretrained: bool, kwargs: dict):
    return _create(ufo_vit.UFOViT, f'ufo_vit_{size}', pretrained, arch=size, **kwargs)


@register_model
def soft_tiny(pretrained=False, **kwargs):
    return _soft('soft', 'tiny', pretrained, kwargs)


@register_model
def soft_small(pretrained=False, **kwargs):
    return _soft('soft', 'small', pretrained, kwargs)


@register_model
def soft_medium(pretrained=False, **kwargs):
    return _soft('soft', 'medium', pretrained, kwargs)


@register_model
def soft_large(pretrained=False, **kwargs):
    return _soft('soft', 'large', pretrained, kwargs)


@register_model
def soft_huge(pretrained=False, **kwargs):
    return _soft('soft', 'huge', pretrained, kwargs)


@register_model
def soft_plus_plus_tiny(pretrained=False, **kwargs):
    return _soft('soft_plus_plus', 'tiny', pretrained, kwargs)


@register_model
def soft_plus_plus_small(pretrained=False, **kwargs):
    return _soft('soft_plus_plus', 'small', pretrained, kwargs)


@register_model
def soft_plus_plus_medium(pretrained=False, **kwargs):
    return _soft('soft_plus_plus', 'medium', pretrained, kwargs)


@register_model
def soft_plus_plus_large(pretrained=False, **kwargs):
    return _soft('soft_plus_plus', 'large', pretrained, kwargs)


@register_model
def soft_plus_plus_huge(pretrained=False, **kwargs):
    return _soft('soft_plus_plus', 'huge', pretrained, kwargs)


@register_model
def ufo_vit_tiny(pretrained=False, **kwargs):
    return _ufo_vit('tiny', pretrained, kwargs)


@register_model
def ufo_vit_small(pretrained=False, **kwargs):
    return _ufo_vit('small', pretrained, kwargs)


@register_model
def ufo_vit_medium(pretrained=False, **kwargs):
    return _ufo_vit('medium', pretrained, kwargs)


@register_model
def ufo_vit_base(pretrained=False, **kwargs):
    return _ufo_vit('base', pretrained, kwargs)
