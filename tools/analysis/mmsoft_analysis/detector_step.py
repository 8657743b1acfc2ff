"""One Mask R-CNN training iteration, timed, with its memory by component.

The detectors are the 1x COCO Mask R-CNN configs: the project's SOFT++ and
UFO-ViT ones, mmdet's Swin-T one, and the peers PVTv2-b2, PVTv2-b2-li and
XCiT-S12, each the Swin-T config with the backbone and the FPN's input
widths swapped (mmdet ships PVTv2 only in RetinaNet configs, and neither
PVTv2-b2-li nor XCiT). PVTv2-b2 is mmdet's (RetinaNet-PVTv2-b2's backbone);
PVTv2-b2-li and XCiT-S12 are timm's, built through mmpretrain's
``TIMMBackbone`` (``type='mmpretrain.TIMMBackbone'``), XCiT's trunk
inside its detection resampling to strides 4-32
(``type='IsotropicPyramid'``, the module the backbone benchmark measures,
from ``configs/comparison/peer_backbones.py``). The iteration
is what ``model.train_step`` runs between data loading and the optimizer
step: the loss forward on a pre-processed batch and its backward. Images and
annotations (boxes, labels, masks) are generated.

Run as a worker (``python -m mmsoft_analysis.detector_step NAME H W``) it
prints one ``RESULT {json}`` line; ``tools/analysis/benchmark.py`` starts
one per (detector, size) so each peak is its own.
"""
import argparse
import copy
import json
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config

from mmsoft.apis import build_model_from_config

from . import REPO
from .measure import (add_live_memory_flag, peak_memory_of, start_worker,
                      timing_fields)
# Importing peers also registers IsotropicPyramid, XCiT-S12's backbone type.
from .peers import (PVTV2_B2_LI, PVTV2_B2_LI_CHANNELS, XCIT_S12_DIMS,
                    XCIT_S12_TRUNK)
from .saved_tensors import SavedTensorRecorder

CONFIG_DIR = REPO / 'configs'
SWIN_T_CONFIG = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
DETECTOR_CONFIGS = {
    'soft++-tiny': str(CONFIG_DIR / 'soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py'),
    'soft++-small': str(CONFIG_DIR / 'soft/mask-rcnn_soft++-small_fpn_1x_coco.py'),
    'ufo-vit-small': str(CONFIG_DIR /
                         'ufo_vit/mask-rcnn_ufo-vit-small_fpn_1x_coco.py'),
    'swin-t': SWIN_T_CONFIG,
    # Backbones swapped by detector_config (see SWAPPED_BACKBONES).
    'pvtv2-b2': SWIN_T_CONFIG,
    'pvtv2-b2-li': SWIN_T_CONFIG,
    'xcit-s12': SWIN_T_CONFIG,
}
# mmdet's configs/pvt/retinanet_pvtv2-b2_fpn_1x_coco.py.
PVTV2_B2_BACKBONE = dict(type='PyramidVisionTransformerV2', embed_dims=64,
                         num_layers=[3, 4, 6, 3])
PVTV2_B2_CHANNELS = [64, 128, 320, 512]
# Detector name -> (backbone config, FPN in_channels) put into the Swin-T
# config. timm's models go through mmpretrain's registry (imported when
# built, not here).
SWAPPED_BACKBONES = {
    'pvtv2-b2': (PVTV2_B2_BACKBONE, PVTV2_B2_CHANNELS),
    'pvtv2-b2-li': (dict(type='mmpretrain.TIMMBackbone', pretrained=False,
                         **PVTV2_B2_LI), PVTV2_B2_LI_CHANNELS),
    # XCiT's trunk (four stride-16 maps) resampled to strides 4-32.
    'xcit-s12': (dict(type='IsotropicPyramid',
                      trunk=dict(type='mmpretrain.TIMMBackbone', pretrained=False,
                                 **XCIT_S12_TRUNK),
                      embed_dims=XCIT_S12_DIMS), [XCIT_S12_DIMS] * 4),
}
# Objects per generated image: COCO's train2017 mean is 7.3.
OBJECTS_PER_IMAGE = 7


def detector_config(name: str) -> Config:
    """The Mask R-CNN 1x config of detector ``name``.

    Raises:
        ValueError: When ``name`` is not one of :data:`DETECTOR_CONFIGS`.
    """
    if name not in DETECTOR_CONFIGS:
        raise ValueError(f'detector {name!r} is not known; expected one of '
                         f'{sorted(DETECTOR_CONFIGS)}.')
    path = DETECTOR_CONFIGS[name]
    if path.startswith('mmdet::'):
        from mmengine.hub import get_config
        cfg = get_config(path)
    else:
        cfg = Config.fromfile(path)
    if name in SWAPPED_BACKBONES:
        backbone, channels = SWAPPED_BACKBONES[name]
        cfg.model.backbone = Config(copy.deepcopy(backbone))
        cfg.model.neck.in_channels = list(channels)
    return cfg


def build_detector(name: str, cfg_options: Optional[dict] = None) -> nn.Module:
    """Detector ``name`` initialised from scratch, in train mode.

    Args:
        name (str): One of :data:`DETECTOR_CONFIGS`.
        cfg_options (dict, optional): Changes to the config, as
            ``Config.merge_from_dict`` takes them (e.g.
            ``{'model.train_cfg.rcnn.sampler.num': 64}``). Default: None.
    """
    cfg = detector_config(name)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    model = build_model_from_config(cfg)
    model.init_weights()
    return model.train()


def generated_batch(model: nn.Module, batch: int, shape: Tuple[int, int],
                    seed: int = 0,
                    shapes: Optional[Sequence[Tuple[int, int]]] = None) -> Dict:
    """A pre-processed batch of random images with boxes, labels and masks.

    Args:
        model (nn.Module): The detector (its data pre-processor normalises
            and pads the images).
        batch (int): Images.
        shape (tuple[int, int]): Image (H, W).
        seed (int): Seed of the images and annotations. Default: 0.
        shapes (Sequence[tuple[int, int]], optional): Each image's (H, W)
            instead of ``shape`` for all (``batch`` of them); the batch is
            padded to the largest. Default: None.

    Returns:
        dict: ``inputs`` (B, 3, H', W') and ``data_samples``, ready for
        ``model(**data, mode='loss')``.
    """
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(seed)
    shapes = [tuple(shape)] * batch if shapes is None else [tuple(s) for s in shapes]
    if len(shapes) != batch:
        raise ValueError(f'shapes={shapes} gives {len(shapes)} images; expected '
                         f'batch={batch}.')
    raw = demo_mm_inputs(batch_size=batch, image_shapes=[(3, *s) for s in shapes],
                         num_items=[OBJECTS_PER_IMAGE] * batch, with_mask=True)
    return model.data_preprocessor(raw, True)


def train_iteration(model: nn.Module, data: Dict) -> None:
    """Loss forward and backward of ``model`` on ``data``; gradients dropped."""
    losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    total.backward()
    model.zero_grad(set_to_none=True)


def saved_bytes_by_component(model: nn.Module, data: Dict) -> Dict[str, int]:
    """Bytes autograd keeps for backward in each top-level part of ``model``
    (backbone, neck, rpn_head, roi_head) during one loss forward."""
    with SavedTensorRecorder(model) as recorder:
        losses = model(**data, mode='loss')
    del losses
    return recorder.bytes_by_prefix(depth=1)


def measure_detector(name: str, shape: Tuple[int, int], batch: int = 2,
                     device: str = 'cpu', warmup: int = 0,
                     repeats: int = 1) -> Dict:
    """Peak memory, time and saved tensors of one training iteration.

    Args:
        name (str): One of :data:`DETECTOR_CONFIGS`.
        shape (tuple[int, int]): Image (H, W).
        batch (int): Images per iteration. Default: 2.
        device (str): ``'cpu'`` or ``'cuda'``. Default: ``'cpu'``.
        warmup (int): Untimed iterations after the memory-measuring one.
            Default: 0.
        repeats (int): Timed iterations; 0 measures the peak only.
            Default: 1.

    Returns:
        dict: ``seconds`` (median), ``all_seconds``, ``cpu_seconds``
        (fastest), ``all_cpu_seconds``, ``peak_bytes``, ``params`` and
        ``saved_bytes`` (by component).
    """
    torch.manual_seed(0)
    model = build_detector(name).to(device)
    data = generated_batch(model, batch, shape)
    step = lambda: train_iteration(model, data)  # noqa: E731
    result = dict(model=name, height=shape[0], width=shape[1], device=device,
                  mode='train_step', batch=batch,
                  threads=torch.get_num_threads(),
                  params=sum(p.numel() for p in model.parameters()))
    result['peak_bytes'] = peak_memory_of(step, torch.device(device))
    if repeats == 0:  # memory only
        return result
    result.update(timing_fields(step, torch.device(device), warmup, repeats))
    result['saved_bytes'] = saved_bytes_by_component(model, data)
    return result


def main():
    """Worker entry point: measures one (detector, size) and prints JSON."""
    parser = argparse.ArgumentParser(description='Measure one detector step.')
    parser.add_argument('name', choices=sorted(DETECTOR_CONFIGS))
    parser.add_argument('height', type=int)
    parser.add_argument('width', type=int)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--warmup', type=int, default=0)
    parser.add_argument('--repeats', type=int, default=1)
    add_live_memory_flag(parser)
    args = parser.parse_args()
    start_worker(args)
    result = measure_detector(args.name, (args.height, args.width), args.batch,
                              args.device, args.warmup, args.repeats)
    print('RESULT ' + json.dumps(result))


if __name__ == '__main__':
    main()
