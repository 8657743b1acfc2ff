"""The GPU benchmark's Mask R-CNN around each backbone.

- ``'mmdet'``: the 1x COCO Mask R-CNN configs (``configs/`` for mmsoft's
  backbones, mmdet's Swin-T config with PVTv2 swapped in for the peers;
  :mod:`mmsoft_analysis.detector_step`), where mmdet and mmcv's compiled
  ops import.
- ``'torchvision'``: torchvision's ``MaskRCNN`` (its defaults: RPN, RoI
  heads, 81 classes for COCO's 80) over the backbone's four maps through
  torchvision's ``FeaturePyramidNetwork`` with a max-pooled P6, the FPN of
  ``mmsoft.torchvision_models.fpn_backbone``. mmsoft's backbones get each
  batch's valid regions, as in mmdet; the peers see the padded canvas.

Both take a generated batch: random images of the input's sizes with
COCO's mean of 7 objects each (boxes, labels, masks). In inference the
score threshold is 0, so that each image's 100 detections run through the
mask head as a trained detector's would, whatever the random weights.
"""
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .gpu_backbones import BackboneMaps, _import_problem, build_maps
from .gpu_benchmark_steps import InputSpec

DETECTORS = ('mmdet', 'torchvision')
NUM_CLASSES = 80
#: Objects per generated image: COCO's train2017 mean is 7.3.
OBJECTS_PER_IMAGE = 7
FPN_CHANNELS = 256
#: ImageNet's mean and std on [0, 1] images (torchvision's detectors').
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)


def import_problem(modules: Sequence[str]) -> Optional[str]:
    """Why one of ``modules`` does not import (the first), or None."""
    for module in modules:
        problem = _import_problem(module)
        if problem is not None:
            return f'{module}: {problem}'
    return None


def detector_problem(kind: str) -> Optional[str]:
    """Why the ``kind`` detectors cannot be built here, or None."""
    if kind == 'mmdet':
        return import_problem(('mmengine', 'mmcv.ops', 'mmdet.models'))
    if kind == 'torchvision':
        return import_problem(('torchvision.models.detection', ))
    raise ValueError(f'detector={kind!r} is not supported; expected one of '
                     f'{list(DETECTORS)}.')


def choose_detector(choice: str) -> Tuple[Optional[str], str]:
    """The detector kind to run for ``choice`` (``'auto'``, ``'mmdet'`` or
    ``'torchvision'``; auto: mmdet's where it imports with mmcv's ops, else
    torchvision's), and a sentence saying why; the kind is None when none
    can be built."""
    if choice != 'auto':
        problem = detector_problem(choice)
        if problem:
            return None, f'{choice} is not usable here ({problem})'
        return choice, f'{choice} asked for'
    mmdet_problem = detector_problem('mmdet')
    if mmdet_problem is None:
        return 'mmdet', "mmdet and mmcv's ops import"
    torchvision_problem = detector_problem('torchvision')
    if torchvision_problem is None:
        return 'torchvision', f"mmdet is not usable here ({mmdet_problem})"
    return None, (f'neither mmdet ({mmdet_problem}) nor torchvision '
                  f'({torchvision_problem}) is usable here')


def map_channels(maps: BackboneMaps) -> Tuple[List[int], bool]:
    """The channels of a backbone's four maps and whether they are NHWC
    (timm's Swin), from its ``feature_info``; a backbone without one (mmdet's)
    is run once on a small image to see them."""
    body = maps.backbone
    info = getattr(body, 'feature_info', None)
    nhwc = str(getattr(body, 'output_fmt', 'NCHW')).endswith('NHWC')
    if hasattr(info, 'channels'):  # timm's FeatureInfo
        return list(info.channels()), nhwc
    if info:  # mmsoft's: a list of dicts
        return [entry['num_chs'] for entry in info], nhwc
    was_training = maps.training
    maps.eval()
    with torch.no_grad():
        probe = maps(torch.zeros(1, 3, 64, 64))
    maps.train(was_training)
    return [feature.shape[1] for feature in probe], False


class DetectionBackbone(nn.Module):
    """A backbone's four maps through torchvision's FPN: what
    ``MaskRCNN(backbone, ...)`` takes (``out_channels``; an ordered dict of
    P2-P5 and the max-pooled P6).

    Args:
        maps (BackboneMaps): The backbone.
        out_channels (int): The FPN's width. Default: 256.
    """

    def __init__(self, maps: BackboneMaps, out_channels: int = FPN_CHANNELS):
        from torchvision.ops.feature_pyramid_network import (FeaturePyramidNetwork,
                                                             LastLevelMaxPool)
        super().__init__()
        channels, self.nhwc = map_channels(maps)
        self.maps = maps
        self.fpn = FeaturePyramidNetwork(channels, out_channels, LastLevelMaxPool())
        self.out_channels = out_channels

    def forward(self, images: torch.Tensor) -> 'OrderedDict[str, torch.Tensor]':
        """(B, 3, H, W) -> the FPN's maps, each (B, out_channels, h, w)."""
        features = self.maps(images)
        if self.nhwc:  # (B, h, w, C) -> (B, C, h, w)
            features = [f.permute(0, 3, 1, 2).contiguous() for f in features]
        return self.fpn(OrderedDict((str(i), f) for i, f in enumerate(features)))


def _pre_resized_transform(on_sizes: Callable[[List[Tuple[int, int]]], None]):
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    class PreResizedTransform(GeneralizedRCNNTransform):
        """Normalises and pads images that the data pipeline has already
        resized, as mmdet's data pre-processor does (no resizing), and hands
        each batch's image sizes to ``on_sizes``."""

        def resize(self, image, target=None):
            return image, target

        def forward(self, images, targets=None):
            image_list, targets = super().forward(images, targets)
            on_sizes(image_list.image_sizes)
            return image_list, targets

    return PreResizedTransform(min_size=800, max_size=1333, image_mean=IMAGE_MEAN,
                               image_std=IMAGE_STD, size_divisible=32)


#: torchvision's ``MaskRCNN`` arguments of the light heads of the CPU smoke
#: mode: few proposals, sampled RoIs and detections.
LIGHT_HEADS = dict(rpn_pre_nms_top_n_train=64, rpn_post_nms_top_n_train=32,
                   rpn_pre_nms_top_n_test=64, rpn_post_nms_top_n_test=32,
                   rpn_batch_size_per_image=32, box_batch_size_per_image=16,
                   box_detections_per_img=4)


def torchvision_mask_rcnn(backbone: str, light_heads: bool = False) -> nn.Module:
    """torchvision's ``MaskRCNN`` over backbone ``backbone`` (a name of
    :data:`~mmsoft_analysis.gpu_backbones.BACKBONES`) and an FPN, on the CPU,
    with a score threshold of 0 (see the module's notes); with
    ``light_heads``, :data:`LIGHT_HEADS` (the smoke mode)."""
    from torchvision.models.detection import MaskRCNN
    maps = build_maps(backbone)

    def on_sizes(sizes: List[Tuple[int, int]]) -> None:
        if maps.takes_valid_shapes:
            maps.valid_shapes = [tuple(int(side) for side in size) for size in sizes]

    model = MaskRCNN(DetectionBackbone(maps), num_classes=NUM_CLASSES + 1,
                     box_score_thresh=0., **(LIGHT_HEADS if light_heads else {}))
    model.transform = _pre_resized_transform(on_sizes)
    return model


def generated_targets(spec: InputSpec, device: torch.device, seed: int = 0
                      ) -> Tuple[List[torch.Tensor], List[Dict[str, torch.Tensor]]]:
    """Images in [0, 1] of the input's sizes (3, h, w each) and their
    targets: :data:`OBJECTS_PER_IMAGE` boxes (x1, y1, x2, y2) inside the
    image, at least an eighth of each side, with labels and filled masks."""
    generator = torch.Generator().manual_seed(seed)
    images, targets = [], []
    for height, width in spec.shapes:
        images.append(torch.rand(3, height, width, generator=generator).to(device))
        corners = torch.rand(OBJECTS_PER_IMAGE, 2, generator=generator)
        extents = 0.125 + 0.375 * torch.rand(OBJECTS_PER_IMAGE, 2, generator=generator)
        x1 = (corners[:, 0] * (1 - extents[:, 0]) * width).floor()
        y1 = (corners[:, 1] * (1 - extents[:, 1]) * height).floor()
        x2 = (x1 + (extents[:, 0] * width).ceil()).clamp(max=width)
        y2 = (y1 + (extents[:, 1] * height).ceil()).clamp(max=height)
        boxes = torch.stack([x1, y1, x2, y2], dim=1)  # (N, 4)
        masks = torch.zeros(OBJECTS_PER_IMAGE, height, width, dtype=torch.uint8)
        for index, (left, top, right, bottom) in enumerate(boxes.long().tolist()):
            masks[index, top:bottom, left:right] = 1
        labels = torch.randint(1, NUM_CLASSES + 1, (OBJECTS_PER_IMAGE, ),
                               generator=generator)
        targets.append(dict(boxes=boxes.to(device), labels=labels.to(device),
                            masks=masks.to(device)))
    return images, targets


def build_detector(kind: str, model: str, backbone: str, spec: InputSpec,
                   device: torch.device, light_heads: bool = False
                   ) -> Tuple[nn.Module, Callable[[nn.Module], torch.Tensor],
                              Callable[[nn.Module], object]]:
    """A Mask R-CNN on ``device`` with its generated batch.

    Args:
        kind (str): One of :data:`DETECTORS`.
        model (str): The benchmark's model name (mmdet's detector configs
            go by it).
        backbone (str): The backbone it resolved to (torchvision's detector
            is built around it).
        spec (InputSpec): The batch's image sizes.
        device (torch.device): Where it runs.
        light_heads (bool): torchvision's detector with
            :data:`LIGHT_HEADS` (the smoke mode). Default: False.

    Returns:
        tuple: the detector, ``loss(detector)`` (the sum of its losses on the
        batch) and ``predict(detector)`` (its detections on the batch).
    """
    if kind == 'mmdet':
        from .detector_step import build_detector as build_mmdet_detector
        from .detector_step import generated_batch
        detector = build_mmdet_detector(
            model, {'model.test_cfg.rcnn.score_thr': 0.}).to(device)
        data = generated_batch(detector, spec.batch, spec.shapes[0],
                               shapes=spec.shapes)
        return (detector,
                lambda m: m.parse_losses(m(**data, mode='loss'))[0],
                lambda m: m(**data, mode='predict'))
    if kind != 'torchvision':
        raise ValueError(f'detector={kind!r} is not supported; expected one of '
                         f'{list(DETECTORS)}.')
    detector = torchvision_mask_rcnn(backbone, light_heads).to(device)
    images, targets = generated_targets(spec, device)
    return (detector, lambda m: sum(m(images, targets).values()),
            lambda m: m(images))
