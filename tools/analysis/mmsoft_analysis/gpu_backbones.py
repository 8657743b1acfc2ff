"""The GPU check's backbones, built with torch alone or with timm.

- mmsoft's: :class:`mmsoft.models.SOFT` (SOFT++) and
  :class:`mmsoft.models.UFOViT` with the settings of their 1x COCO Mask R-CNN
  configs (``configs/soft/``, ``configs/ufo_vit/``: drop-path rate,
  ``solver='newton_closed_form'``, ``max_bottleneck_tokens=256``), without a
  checkpoint. They need only torch.
- The peers, timm's (``features_only=True``, four maps at strides 4-32):
  Swin-T (``swin_tiny_patch4_window7_224`` taking any input size: shifted
  window masks built per input, the image padded to the patch size),
  PVTv2-b2 (``pvt_v2_b2``; ``pvt_v2_b2_li`` on request) and XCiT-S12/16
  (``xcit_small_12_p16_224``, blocks 3, 5, 7 and 11, resampled to strides
  4-32 as XCiT's detection models do: :class:`StridePyramid`). Drop-path
  rates as in the detection configs of each paper.
- On request, where mmdet is importable: mmdet's Swin-T and PVTv2-b2
  (``mmdet-swin-t``, ``mmdet-pvtv2-b2``).

:func:`build_maps` returns a :class:`BackboneMaps`: ``maps(images)`` gives the
four maps; mmsoft's backbones also take the batch's valid regions
(``maps.valid_shapes``), the peers see the whole padded canvas, as a
detector without valid regions gives it to them.
"""
import functools
import importlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

#: mmsoft's backbones: the model family and the configs' settings.
MMSOFT_BACKBONES: Dict[str, Dict] = {
    'soft++-tiny': dict(family='soft++', arch='tiny', drop_path_rate=0.1),
    'soft++-small': dict(family='soft++', arch='small', drop_path_rate=0.2),
    'ufo-vit-small': dict(family='ufo-vit', arch='small', drop_path_rate=0.1),
}
#: SOFT++ settings of every SOFT++ config (``configs/soft/_base_/soft++.py``).
SOFT_PLUS_PLUS = dict(variant='soft++', solver='newton_closed_form', newton_iters=20,
                      max_bottleneck_tokens=256)
#: timm's peers: ``timm.create_model`` arguments beyond ``features_only``.
TIMM_PEERS: Dict[str, Dict] = {
    'swin-t': dict(model_name='swin_tiny_patch4_window7_224', drop_path_rate=0.2,
                   strict_img_size=False),
    'pvtv2-b2': dict(model_name='pvt_v2_b2', drop_path_rate=0.1),
    'pvtv2-b2-li': dict(model_name='pvt_v2_b2_li', drop_path_rate=0.1),
    'xcit-s12': dict(model_name='xcit_small_12_p16_224', drop_path_rate=0.05,
                     out_indices=(3, 5, 7, 11)),
}
#: XCiT-S12's channels, the same in its four maps.
XCIT_S12_DIMS = 384
#: mmdet's peers: the class in ``mmdet.models.backbones`` and its settings
#: (those of mmdet's Swin-T Mask R-CNN and PVTv2-b2 RetinaNet configs).
MMDET_PEERS: Dict[str, Tuple[str, Dict]] = {
    'mmdet-swin-t': ('SwinTransformer', dict(
        embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
        mlp_ratio=4, qkv_bias=True, drop_path_rate=0.2, out_indices=(0, 1, 2, 3))),
    'mmdet-pvtv2-b2': ('PyramidVisionTransformerV2', dict(
        embed_dims=64, num_layers=[3, 4, 6, 3], drop_path_rate=0.1)),
}
#: Every backbone the check knows, in its default order of measurement.
BACKBONES = tuple(MMSOFT_BACKBONES) + tuple(TIMM_PEERS) + tuple(MMDET_PEERS)
#: Those measured when none are named.
DEFAULT_BACKBONES = ('soft++-tiny', 'soft++-small', 'ufo-vit-small', 'swin-t',
                     'pvtv2-b2', 'xcit-s12')


def is_soft(name: str) -> bool:
    """Whether ``name`` is a SOFT++ backbone (it takes a solver)."""
    return MMSOFT_BACKBONES.get(name, {}).get('family') == 'soft++'


def is_mmsoft(name: str) -> bool:
    """Whether ``name`` is one of mmsoft's backbones."""
    return name in MMSOFT_BACKBONES


def source_of(name: str) -> str:
    """``'mmsoft'``, ``'timm'`` or ``'mmdet'``: where ``name`` comes from."""
    if name in MMSOFT_BACKBONES:
        return 'mmsoft'
    if name in TIMM_PEERS:
        return 'timm'
    if name in MMDET_PEERS:
        return 'mmdet'
    raise ValueError(f'backbone {name!r} is not known; expected one of {BACKBONES}.')


@functools.lru_cache(maxsize=None)
def _import_problem(module: str) -> Optional[str]:
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure makes the framework unusable
        return f'{type(error).__name__}: {error}'.splitlines()[0][:200]
    return None


def unavailable_reason(name: str) -> Optional[str]:
    """Why backbone ``name`` cannot be built here (its framework does not
    import), or None when it can."""
    source = source_of(name)
    if source == 'mmsoft':
        return None
    module = 'timm' if source == 'timm' else 'mmdet.models.backbones'
    problem = _import_problem(module)
    if problem is None:
        return None
    if source == 'timm':
        return (f"timm is not usable here ({problem}): timm's {name!r} is skipped, "
                f"as are the other timm peers; install timm, or measure mmdet's "
                f"peers (mmdet-swin-t, mmdet-pvtv2-b2) where mmdet is installed")
    return f'mmdet is not usable here ({problem}): {name!r} is skipped'


class StridePyramid(nn.Module):
    """Four maps of one stride s resampled to strides s/4, s/2, s and 2s.

    The resampling of XCiT's detection backbone: two 2x2 transposed
    convolutions with BatchNorm and GELU between them (x4), one (x2), the
    map itself, a 2x2 max pool (/2).

    Args:
        trunk (nn.Module): Returns four (B, C, H, W) maps of one stride.
        dims (int): C.
    """

    def __init__(self, trunk: nn.Module, dims: int):
        super().__init__()
        self.trunk = trunk
        self.up4 = nn.Sequential(
            nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2),
            nn.BatchNorm2d(dims), nn.GELU(),
            nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2))
        self.up2 = nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2)
        self.down2 = nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)

    def forward(self, images: torch.Tensor) -> List[torch.Tensor]:
        """(B, 3, H, W) -> maps of (4h, 4w), (2h, 2w), (h, w), (ceil(h/2),
        ceil(w/2)) cells, (h, w) the trunk's grid."""
        maps = list(self.trunk(images))
        if len(maps) != 4:
            raise ValueError(f'the trunk gave {len(maps)} maps; expected 4.')
        return [self.up4(maps[0]), self.up2(maps[1]), maps[2], self.down2(maps[3])]


class BackboneMaps(nn.Module):
    """A backbone as the check calls it: ``maps(images)`` -> its four maps.

    Args:
        backbone (nn.Module): mmsoft's model (its ``forward_intermediates``
            is called), or a module returning a sequence of maps.
        takes_valid_shapes (bool): Whether the backbone takes the batch's
            valid regions, (h, w) per image, from :attr:`valid_shapes`.
    """

    def __init__(self, backbone: nn.Module, takes_valid_shapes: bool):
        super().__init__()
        self.backbone = backbone
        self.takes_valid_shapes = takes_valid_shapes
        self.valid_shapes: Optional[Sequence[Tuple[int, int]]] = None

    def forward(self, images: torch.Tensor) -> List[torch.Tensor]:
        """(B, 3, H, W) -> four maps (NCHW; timm's Swin gives NHWC)."""
        if self.takes_valid_shapes:
            return self.backbone.forward_intermediates(
                images, intermediates_only=True, valid_shapes=self.valid_shapes)
        return list(self.backbone(images))


def _mmsoft_backbone(name: str, solver: Optional[str], overrides: Dict) -> nn.Module:
    from mmsoft.models import SOFT, UFOViT
    settings = dict(MMSOFT_BACKBONES[name])
    family = settings.pop('family')
    if family == 'ufo-vit':
        return UFOViT(**settings, **overrides)
    settings.update(SOFT_PLUS_PLUS)
    if solver is not None:
        settings['solver'] = solver
    settings.update(overrides)
    return SOFT(**settings)


def _timm_backbone(name: str) -> nn.Module:
    import timm
    settings = dict(TIMM_PEERS[name])
    model_name = settings.pop('model_name')
    if name == 'swin-t':
        from timm.layers import PatchEmbed

        # Pads images whose sides are not multiples of the patch size.
        settings['embed_layer'] = functools.partial(PatchEmbed, dynamic_img_pad=True)
    model = timm.create_model(model_name, pretrained=False, features_only=True,
                              **settings)
    if name == 'xcit-s12':
        model = StridePyramid(model, XCIT_S12_DIMS)
    return model


def _mmdet_backbone(name: str) -> nn.Module:
    backbones = importlib.import_module('mmdet.models.backbones')
    class_name, settings = MMDET_PEERS[name]
    model = getattr(backbones, class_name)(**settings)
    model.init_weights()
    return model


def build_maps(name: str, solver: Optional[str] = None, **overrides) -> BackboneMaps:
    """Backbone ``name`` initialised from scratch (seed 0), on the CPU.

    Args:
        name (str): One of :data:`BACKBONES`.
        solver (str, optional): The kernel-inverse solver of a SOFT++
            backbone. Default: None (the configs' ``'newton_closed_form'``).
        **overrides: Further arguments of mmsoft's backbones (e.g.
            ``memory_efficient=False``); none for the peers.

    Raises:
        RuntimeError: When the backbone's framework is not usable here (see
            :func:`unavailable_reason`).
    """
    reason = unavailable_reason(name)
    if reason is not None:
        raise RuntimeError(reason)
    torch.manual_seed(0)
    source = source_of(name)
    if source == 'mmsoft':
        return BackboneMaps(_mmsoft_backbone(name, solver, overrides),
                            takes_valid_shapes=True)
    if overrides:
        raise ValueError(f'overrides={overrides} are invalid for {name!r}: only '
                         f"mmsoft's backbones take them.")
    if source == 'timm':
        return BackboneMaps(_timm_backbone(name), takes_valid_shapes=False)
    return BackboneMaps(_mmdet_backbone(name), takes_valid_shapes=False)
