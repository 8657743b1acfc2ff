"""torchvision adapter: SOFT, SOFT++ and UFO-ViT under torchvision's detectors.

:func:`fpn_backbone` puts torchvision's ``FeaturePyramidNetwork`` on the
multi-scale maps (strides 4, 8, 16, 32) of :class:`mmsoft.models.SOFT` or
:class:`mmsoft.models.UFOViT`. The result is what ``MaskRCNN``,
``FasterRCNN``, ``RetinaNet`` and ``FCOS`` take as ``backbone``: a module with
``out_channels`` whose forward returns an ordered dict of maps. Needs torch
and torchvision, not timm; ``import mmsoft`` does not import this module.
"""
from collections import OrderedDict
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torchvision.ops.feature_pyramid_network import (ExtraFPNBlock,
                                                     FeaturePyramidNetwork,
                                                     LastLevelMaxPool, LastLevelP6P7)

from .models import soft, ufo_vit
from .utils import check_out_indices, check_positive_int


def _model_configs() -> Dict[str, Tuple[type, dict]]:
    """timm's names of the models: name -> (class, the arguments it fixes)."""
    configs = {}
    for variant in soft.VARIANTS:  # 'soft' -> soft_*, 'soft++' -> soft_plus_plus_*
        prefix = variant.replace('++', '_plus_plus')
        for size in soft.ARCH_SETTINGS:
            configs[f'{prefix}_{size}'] = (soft.SOFT, dict(arch=size, variant=variant))
    for size in ufo_vit.ARCH_SETTINGS:
        configs[f'ufo_vit_{size}'] = (ufo_vit.UFOViT, dict(arch=size))
    return configs


#: The names :func:`fpn_backbone` builds (the timm names) -> (class, fixed arguments).
MODEL_CONFIGS = _model_configs()
#: The extra FPN levels by name: ``'max_pool'`` (P6 max-pooled from P5, key
#: ``'pool'``: Mask R-CNN, Faster R-CNN), ``'p6p7'`` (P6 and P7 by stride-2
#: convolutions from the last body map, keys ``'p6'``, ``'p7'``: RetinaNet,
#: FCOS) and ``'none'``.
EXTRA_BLOCKS = ('max_pool', 'p6p7', 'none')


class FPNBackbone(nn.Module):
    """An mmsoft model's maps (``out_indices``) through torchvision's
    ``FeaturePyramidNetwork``, keyed as ``BackboneWithFPN``'s: ``'0'``, ``'1'``,
    ..., then the extra block's."""

    def __init__(self, body: nn.Module, out_indices: Sequence[int],
                 fpn: FeaturePyramidNetwork, out_channels: int):
        super().__init__()
        self.body = body
        self.fpn = fpn
        self.out_indices = tuple(out_indices)
        self.out_channels = out_channels

    def forward_body(self, x: torch.Tensor) -> 'OrderedDict[str, torch.Tensor]':
        """The body's maps, before the FPN: (B, C_i, H / 2**(i + 2), W / 2**(i + 2))."""
        maps = self.body.forward_intermediates(x, indices=list(self.out_indices),
                                               intermediates_only=True)
        return OrderedDict((str(k), feat) for k, feat in enumerate(maps))

    def forward(self, x: torch.Tensor) -> 'OrderedDict[str, torch.Tensor]':
        """Images (B, 3, H, W) -> the FPN's maps, each (B, out_channels, h, w)."""
        return self.fpn(self.forward_body(x))


def fpn_backbone(model: Union[str, nn.Module], out_channels: int = 256,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 extra_blocks: Union[str, ExtraFPNBlock] = 'max_pool',
                 norm_layer: Optional[Callable[..., nn.Module]] = None,
                 **model_kwargs) -> FPNBackbone:
    """A torchvision detection backbone: an mmsoft model under an FPN.

    ``fpn_backbone('soft_plus_plus_tiny')`` is Mask R-CNN's and Faster R-CNN's
    (P2-P5 and a max-pooled P6); ``fpn_backbone(name, out_indices=(1, 2, 3),
    extra_blocks='p6p7')`` is RetinaNet's (P3-P7).

    Args:
        model (str | SOFT | UFOViT): A timm name (:data:`MODEL_CONFIGS`), built
            with ``model_kwargs``, or a built model.
        extra_blocks (str | ExtraFPNBlock): One of :data:`EXTRA_BLOCKS`, or a
            torchvision ``ExtraFPNBlock``.

    Raises:
        ValueError: An unknown name or argument, or outputs the model lacks.
        TypeError: ``model`` neither a name nor a model, or ``model_kwargs``
            with a built model."""
    out_indices = check_out_indices(out_indices, 4)
    check_positive_int('out_channels', out_channels)
    if not isinstance(extra_blocks, ExtraFPNBlock) and (
            not isinstance(extra_blocks, str) or extra_blocks not in EXTRA_BLOCKS):
        raise ValueError(f'extra_blocks={extra_blocks!r} is not supported; expected '
                         f'one of {list(EXTRA_BLOCKS)} or a torchvision '
                         f'ExtraFPNBlock.')
    body = _body(model, out_indices, model_kwargs)
    in_channels = [body.feature_info[i]['num_chs'] for i in out_indices]
    extra = _extra_block(extra_blocks, in_channels[-1], out_channels)
    fpn = FeaturePyramidNetwork(in_channels, out_channels, extra, norm_layer)
    return FPNBackbone(body, out_indices, fpn, out_channels)


def _body(model: Union[str, nn.Module], out_indices: Tuple[int, ...],
          model_kwargs: dict) -> nn.Module:
    """The model of :func:`fpn_backbone`, built from a name or checked."""
    if isinstance(model, str):
        if model not in MODEL_CONFIGS:
            raise ValueError(f'model={model!r} is not a model name; expected one of '
                             f'{list(MODEL_CONFIGS)}.')
        model_cls, fixed = MODEL_CONFIGS[model]
        clashes = sorted(set(fixed) & set(model_kwargs))
        if clashes:
            raise ValueError(f'{clashes} cannot be given with model={model!r}, which '
                             f'sets {fixed}.')
        return model_cls(out_indices=out_indices, **fixed, **model_kwargs)
    if not isinstance(model, (soft.SOFT, ufo_vit.UFOViT)):
        raise TypeError(f'model={type(model).__name__} is not supported; expected a '
                        f'name of {list(MODEL_CONFIGS)}, or an '
                        f'mmsoft.models.SOFT or UFOViT.')
    if model_kwargs:
        raise TypeError(f'{sorted(model_kwargs)} are arguments of a model built from a '
                        f'name; model is a built {type(model).__name__}.')
    if isinstance(model, ufo_vit.UFOViT):
        if model.pyramid is None:
            raise ValueError('model is a UFOViT with multi_scale=False (four '
                             'stride-16 maps); the FPN needs strides 4-32: build it '
                             'with multi_scale=True.')
        missing = [i for i in out_indices if i not in model.pyramid.out_indices]
        if missing:
            raise ValueError(f'out_indices={list(out_indices)} asks for outputs '
                             f'{missing} that the UFOViT has no pyramid branch for '
                             f'(built with out_indices={model.out_indices}).')
    return model


def _extra_block(extra_blocks: Union[str, ExtraFPNBlock], last_channels: int,
                 out_channels: int) -> Optional[ExtraFPNBlock]:
    """The FPN's extra levels named by ``extra_blocks`` (checked)."""
    if isinstance(extra_blocks, ExtraFPNBlock):
        return extra_blocks
    if extra_blocks == 'max_pool':
        return LastLevelMaxPool()
    if extra_blocks == 'p6p7':
        block = LastLevelP6P7(last_channels, out_channels)
        # torchvision reads P5 instead when the widths are equal; always the body's map.
        block.use_P5 = False
        return block
    return None
