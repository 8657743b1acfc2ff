"""The backbones the tools measure, one model per name of :data:`NAMES`, and
the Mask R-CNN around any of them.

A *spec* is ``[LABEL=]NAME[:key=value,...]``, ``NAME`` a name or the path of an
mmdet or mmseg config (its backbone); the options are the model's arguments,
but for ``root=PATH`` (mmsoft from another checkout), ``plain=Class/Class``
(those modules run plain autograd) and ``checkpointing=True``.
"""
import ast
import contextlib
import copy
import functools
import importlib
import logging
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from . import REPO

#: mmsoft's backbones: class, arch and the COCO Mask R-CNN config's drop-path rate.
MMSOFT = {**{f'soft++-{arch}': ('SOFT', arch, rate) for arch, rate in
             (('tiny', 0.1), ('small', 0.2), ('medium', 0.3), ('large', 0.3))},
          **{f'ufo-vit-{arch}': ('UFOViT', arch, rate) for arch, rate in
             (('tiny', 0.05), ('small', 0.1), ('medium', 0.15), ('base', 0.2))}}
#: The settings every SOFT++ config shares (``configs/soft/_base_/soft++.py``).
SOFT_PLUS_PLUS = dict(variant='soft++', solver='newton_closed_form', newton_iters=20,
                      max_bottleneck_tokens=256)
#: The peers: origin, class or timm model, settings.
PEERS = {
    'swin-t': ('mmdet', 'SwinTransformer', dict(
        embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
        mlp_ratio=4, qkv_bias=True, drop_path_rate=0.2, out_indices=(0, 1, 2, 3))),
    'pvtv2-b2': ('mmdet', 'PyramidVisionTransformerV2', dict(
        embed_dims=64, num_layers=[3, 4, 6, 3], drop_path_rate=0.1)),
    'timm-swin-t': ('timm', 'swin_tiny_patch4_window7_224', dict(
        drop_path_rate=0.2, strict_img_size=False)),
    'timm-pvtv2-b2': ('timm', 'pvt_v2_b2', dict(drop_path_rate=0.1)),
    'pvtv2-b2-li': ('timm', 'pvt_v2_b2_li', dict(drop_path_rate=0.1)),
    'xcit-s12': ('timm', 'xcit_small_12_p16_224', dict(
        drop_path_rate=0.05, out_indices=(3, 5, 7, 11))),
}
NAMES = tuple(MMSOFT) + tuple(PEERS)
#: The options a spec may give that are not the model's arguments.
TOOL_OPTIONS = ('root', 'plain', 'checkpointing')
SWIN_T_CONFIG = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
#: Objects per generated image: COCO's train2017 mean is 7.3.
OBJECTS_PER_IMAGE = 7


class Spec(NamedTuple):
    """A parsed spec: its label, the model's name (or config path) and options."""
    label: str
    name: str
    options: Dict

    @property
    def kwargs(self) -> Dict:
        """The options that are the model's arguments."""
        return {k: v for k, v in self.options.items() if k not in TOOL_OPTIONS}


def parse_spec(text: str) -> Spec:
    """Reads ``[LABEL=]NAME[:key=value,...]`` (ValueError on an unknown name,
    a config that does not exist or an option that is not ``key=value``)."""
    label, sep, rest = text.partition('=')
    if not sep or ':' in label:
        label, rest = text, text
    name, _, options = rest.partition(':')
    if name.endswith('.py'):
        if not (REPO / name).is_file() and not Path(name).is_file():
            raise ValueError(f'config {name!r} (a spec ending in .py) does not exist.')
    elif name not in NAMES:
        raise ValueError(f'model {name!r} is not known; expected one of {list(NAMES)} '
                         "(optionally followed by ':key=value,...'), or a config path.")
    kwargs = {}
    for item in filter(None, options.split(',')):
        key, sep, value = item.partition('=')
        if not sep:
            raise ValueError(f'option {item!r} of {text!r} is invalid; expected '
                             'key=value.')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return Spec(label, name, kwargs)


def origin(name: str) -> str:
    """Where the model ``name`` comes from: mmsoft, mmdet, timm or config."""
    if name in MMSOFT:
        return 'mmsoft'
    return PEERS[name][0] if name in PEERS else 'config'


@functools.lru_cache(maxsize=None)
def import_problem(module: str) -> Optional[str]:
    """Why ``module`` does not import here, or None."""
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure makes the framework unusable
        return f'{type(error).__name__}: {error}'.splitlines()[0][:200]
    return None


def unavailable(name: str, detector: bool = False) -> Optional[str]:
    """Why ``name`` (and, with ``detector``, its Mask R-CNN) cannot be built
    here, or None."""
    needs = {'mmdet': ['mmdet.models'], 'timm': ['timm'],
             'config': ['mmengine']}.get(origin(name), [])
    needs += ['mmengine'] * (name == 'xcit-s12')
    needs += ['mmcv.ops', 'mmdet.models'] * detector
    for module in needs:
        problem = import_problem(module)
        if problem is not None:
            return f'{name} needs {module}, which does not import here ({problem})'
    return None


@contextlib.contextmanager
def quiet_mmengine():
    """Drops mmengine's INFO records (a top-level ``init_weights`` logs one per
    parameter) while inside."""
    try:
        from mmengine.logging import MMLogger
    except ImportError:
        yield
        return
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


class Backbone(nn.Module):
    """A backbone as the tools call it: images (B, 3, H, W) -> its maps, NCHW.
    mmsoft's take each image's valid region, (h, w) each, from
    :attr:`valid_shapes`; the others see the whole padded canvas."""

    def __init__(self, body: nn.Module, takes_valid_shapes: bool, nhwc: bool = False):
        super().__init__()
        self.body = body
        self.takes_valid_shapes = takes_valid_shapes
        self.nhwc = nhwc
        self.valid_shapes: Optional[Sequence[Tuple[int, int]]] = None

    def forward(self, images: torch.Tensor) -> List[torch.Tensor]:
        if self.takes_valid_shapes:
            return self.body.forward_intermediates(
                images, intermediates_only=True, valid_shapes=self.valid_shapes)
        maps = list(self.body(images))
        return [m.permute(0, 3, 1, 2) for m in maps] if self.nhwc else maps


def config_backbone(path: str, **overrides) -> nn.Module:
    """The backbone of config ``path``'s model (mmdet or mmseg), built in the
    config's scope after its ``custom_imports``, without weights, with
    ``overrides`` in its settings."""
    from mmengine.config import Config

    from mmsoft.apis import build_model_from_config
    config = Config.fromfile(path)
    config.model.backbone.update(overrides)
    return build_model_from_config(config).backbone


def _body(name: str, kwargs: Dict) -> nn.Module:
    if name in MMSOFT:
        import mmsoft.models
        family, arch, rate = MMSOFT[name]
        settings = dict(arch=arch, drop_path_rate=rate)
        settings.update(SOFT_PLUS_PLUS if family == 'SOFT' else {})
        return getattr(mmsoft.models, family)(**dict(settings, **kwargs))
    if name.endswith('.py'):
        body = config_backbone(name, **kwargs)
    elif origin(name) == 'mmdet':
        _, class_name, settings = PEERS[name]
        body = getattr(importlib.import_module('mmdet.models.backbones'),
                       class_name)(**dict(settings, **kwargs))
    else:
        import timm
        _, model_name, settings = PEERS[name]
        settings = dict(settings, **kwargs)
        if model_name.startswith('swin'):  # images padded to the patch size
            settings['embed_layer'] = functools.partial(timm.layers.PatchEmbed,
                                                        dynamic_img_pad=True)
        body = timm.create_model(model_name, pretrained=False, features_only=True,
                                 **settings)
        if name == 'xcit-s12':
            from configs.comparison.peer_backbones import IsotropicPyramid
            body = IsotropicPyramid(body, body.feature_info.channels()[0])
    if hasattr(body, 'init_weights'):
        with quiet_mmengine():
            body.init_weights()
    return body


def build_backbone(text: str) -> Backbone:
    """The backbone of spec ``text``, initialised from seed 0, in eval mode
    (RuntimeError where its framework does not import, ValueError on a bad
    spec or a ``plain=`` that names no module of the model)."""
    spec = parse_spec(text)
    problem = None if spec.name.endswith('.py') else unavailable(spec.name)
    if problem:
        raise RuntimeError(problem)
    torch.manual_seed(0)
    body = _body(spec.name, spec.kwargs)
    plain = set(str(spec.options.get('plain', '')).split('/')) - {''}
    chosen = [m for m in body.modules() if type(m).__name__ in plain]
    missing = plain - {type(m).__name__ for m in chosen}
    if missing:
        raise ValueError(f'plain={"/".join(sorted(missing))} names no module of '
                         f'{spec.name}.')
    for module in chosen:
        module.memory_efficient = False
    if spec.options.get('checkpointing'):
        body.set_grad_checkpointing(True)
    nhwc = str(getattr(body, 'output_fmt', 'NCHW')).endswith('NHWC')
    return Backbone(body, origin(spec.name) == 'mmsoft', nhwc).eval()


def build_detector(text: str, shapes: Sequence[Tuple[int, int]], device: torch.device
                   ) -> Tuple[nn.Module, Callable, Callable]:
    """The 1x COCO Mask R-CNN of spec ``text`` in train mode (mmsoft's own
    config, or a peer's backbone in mmdet's Swin-T config), ``loss(detector)``
    and ``predict(detector)`` on a generated batch of images of ``shapes``,
    each with :data:`OBJECTS_PER_IMAGE` boxes, labels and masks."""
    from mmdet.testing import demo_mm_inputs
    from mmengine.config import Config
    from mmengine.hub import get_config

    from mmsoft.apis import build_model_from_config
    spec = parse_spec(text)
    problem = unavailable(spec.name, detector=True)
    if problem:
        raise RuntimeError(problem)
    if spec.name in MMSOFT:
        folder = 'soft' if spec.name.startswith('soft') else 'ufo_vit'
        cfg = Config.fromfile(
            str(REPO / 'configs' / folder / f'mask-rcnn_{spec.name}_fpn_1x_coco.py'))
        cfg.model.backbone.update(spec.kwargs)
    else:
        cfg = get_config(SWIN_T_CONFIG)
    # Each image's 100 detections reach the mask head, as a trained detector's.
    cfg.model.test_cfg.rcnn.score_thr = 0.
    backbone = None
    if spec.name not in MMSOFT and spec.name != 'swin-t':
        backbone = build_backbone(text)
        with torch.no_grad():
            cfg.model.neck.in_channels = [m.shape[1] for m in
                                          backbone(torch.zeros(1, 3, 64, 64))]
    torch.manual_seed(0)
    detector = build_model_from_config(cfg)
    with quiet_mmengine():
        detector.init_weights()
    if backbone is not None:
        detector.backbone = backbone
    detector.to(device)
    raw = demo_mm_inputs(batch_size=len(shapes), image_shapes=[(3, *s) for s in shapes],
                         num_items=[OBJECTS_PER_IMAGE] * len(shapes), with_mask=True)
    data = detector.data_preprocessor(copy.deepcopy(raw), True)
    return (detector.train(), lambda m: m.parse_losses(m(**data, mode='loss'))[0],
            lambda m: m(**data, mode='predict'))
