"""Mask R-CNN and UperNet around an mmsoft backbone, from the libraries' bases.

Used by the tests to check that a backbone trains inside real detectors and
segmentors; the models are built from the configs shipped inside the mmdet
and mmseg wheels, with only the backbone and the channel counts replaced.
"""
from typing import Dict, List, Sequence, Tuple

import torch
from mmengine.hub import get_config

from mmsoft.apis import build_in_scope

MASK_RCNN_BASE = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
UPERNET_BASE = 'mmseg::_base_/models/upernet_r50.py'


def build_mask_rcnn(backbone: dict, in_channels: Sequence[int]) -> torch.nn.Module:
    """Mask R-CNN + FPN of mmdet's 1x COCO config around ``backbone``.

    Args:
        backbone (dict): Backbone config, e.g. ``dict(type='SOFT')``.
        in_channels (Sequence[int]): Channels of the backbone's four maps.

    Returns:
        nn.Module: The initialised detector.
    """
    cfg = get_config(MASK_RCNN_BASE)
    cfg.model.backbone = backbone
    cfg.model.neck.in_channels = list(in_channels)
    model = build_in_scope('mmdet', cfg.model)
    model.init_weights()
    return model


def build_upernet(backbone: dict, in_channels: Sequence[int],
                  num_classes: int = 19) -> torch.nn.Module:
    """UperNet of mmseg's base config around ``backbone``, with BN (not SyncBN).

    Args:
        backbone (dict): Backbone config.
        in_channels (Sequence[int]): Channels of the backbone's four maps.
        num_classes (int): Segmentation classes. Default: 19.

    Returns:
        nn.Module: The initialised segmentor.
    """
    cfg = get_config(UPERNET_BASE)
    norm_cfg = dict(type='BN', requires_grad=True)
    cfg.model.backbone = backbone
    cfg.model.pretrained = None  # the base's ResNet weights
    cfg.model.data_preprocessor.size_divisor = 32  # the base sets no padding
    cfg.model.decode_head.update(in_channels=list(in_channels), norm_cfg=norm_cfg,
                                 num_classes=num_classes)
    cfg.model.auxiliary_head.update(in_channels=in_channels[2], norm_cfg=norm_cfg,
                                    num_classes=num_classes)
    model = build_in_scope('mmseg', cfg.model)
    model.init_weights()
    return model


def demo_seg_inputs(batch_size: int, size: Tuple[int, int], num_classes: int,
                    seed: int = 0) -> Dict[str, List]:
    """A random segmentation batch in the segmentor's input format."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    generator = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, *size), generator=generator,
                                    dtype=torch.uint8))
        labels = torch.randint(0, num_classes, (1, *size), generator=generator)
        sample = SegDataSample(metainfo=dict(img_shape=size, ori_shape=size,
                                             pad_shape=size))
        sample.gt_sem_seg = PixelData(data=labels)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _train_step(model: torch.nn.Module, batch: dict) -> Dict[str, float]:
    """One forward/backward on ``batch``; returns the scalar losses."""
    model.train()
    data = model.data_preprocessor(batch, True)
    losses = model(**data, mode='loss')
    total, log_vars = model.parse_losses(losses)
    model.zero_grad()
    total.backward()
    return {name: float(value) for name, value in log_vars.items()}


def detector_train_step(model: torch.nn.Module, size: Tuple[int, int] = (64, 64),
                        batch_size: int = 2) -> Dict[str, float]:
    """One training step of a detector on a generated batch with masks."""
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    batch = demo_mm_inputs(batch_size=batch_size, image_shapes=[(3, *size)] *
                           batch_size, num_items=[3] * batch_size, with_mask=True)
    return _train_step(model, batch)


def segmentor_train_step(model: torch.nn.Module, size: Tuple[int, int] = (64, 64),
                         batch_size: int = 2,
                         num_classes: int = 19) -> Dict[str, float]:
    """One training step of a segmentor on a generated batch."""
    return _train_step(model, demo_seg_inputs(batch_size, size, num_classes))


def backbone_grad_norm(model: torch.nn.Module) -> float:
    """Sum of gradient norms over the backbone's parameters."""
    return float(sum(p.grad.norm() for p in model.backbone.parameters()
                     if p.grad is not None))
