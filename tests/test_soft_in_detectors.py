"""SOFT-tiny trains inside mmdet's Mask R-CNN and mmseg's UperNet."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import torch
import torch.nn.functional as F

from tests.helpers.dense_models import (backbone_grad_norm, build_mask_rcnn,
                                        build_upernet, demo_seg_inputs,
                                        detector_train_step, segmentor_train_step)

# Mask R-CNN, UperNet and RoIAlign: mmcv's compiled ops; left out of the floor
# run (mmcv-lite), see setup.cfg.
pytestmark = [pytest.mark.openmmlab, pytest.mark.mmcv_ops]

SOFT_TINY = dict(type='SOFT', arch='tiny', variant='soft++', solver='exact')
TINY_DIMS = [64, 128, 320, 512]


def test_mask_rcnn_trains_and_predicts():
    torch.manual_seed(0)
    model = build_mask_rcnn(SOFT_TINY, TINY_DIMS)
    losses = detector_train_step(model, size=(64, 96))
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0
    from mmdet.testing import demo_mm_inputs
    model.eval()
    batch = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 96)])
    with torch.no_grad():
        results = model.test_step(batch)
    assert 'bboxes' in results[0].pred_instances


def test_upernet_trains_and_predicts():
    torch.manual_seed(0)
    model = build_upernet(SOFT_TINY, TINY_DIMS, num_classes=5)
    losses = segmentor_train_step(model, size=(64, 64), num_classes=5)
    assert 'decode.loss_ce' in losses and 'aux.loss_ce' in losses
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert backbone_grad_norm(model) > 0
    model.eval()
    with torch.no_grad():
        results = model.test_step(demo_seg_inputs(1, (64, 64), 5))
    assert results[0].pred_sem_seg.data.shape == (1, 64, 64)


def roi_align_reference(feat: torch.Tensor, rois: torch.Tensor, size: int,
                        scale: float) -> torch.Tensor:
    """RoIAlign from its definition, for boxes inside the map.

    The aligned variant (box corners scaled and shifted by half a pixel),
    2 x 2 bilinear samples per bin, averaged. Samples are read with
    ``grid_sample``, whose result does not depend on the memory layout;
    the border padding clamps coordinates to the map as RoIAlign does for
    points within one pixel of it.

    Args:
        feat (Tensor): Maps, shape (B, C, H, W).
        rois (Tensor): Boxes ``(batch_index, x1, y1, x2, y2)`` in image
            pixels, shape (K, 5).
        size (int): Output side.
        scale (float): Map pixels per image pixel.

    Returns:
        Tensor: Shape (K, C, size, size).
    """
    height, width = feat.shape[-2:]
    # Sample positions along a box side, as fractions of it: 2 per bin.
    fractions = (torch.arange(2 * size, dtype=feat.dtype) + 0.5) / (2 * size)
    pooled = []
    for index, x1, y1, x2, y2 in rois.tolist():
        xs = x1 * scale - 0.5 + fractions * (x2 - x1) * scale
        ys = y1 * scale - 0.5 + fractions * (y2 - y1) * scale
        grid_y, grid_x = torch.meshgrid(2 * ys / (height - 1) - 1,
                                        2 * xs / (width - 1) - 1, indexing='ij')
        grid = torch.stack((grid_x, grid_y), dim=-1)[None]  # (1, 2s, 2s, 2)
        samples = F.grid_sample(feat[int(index)][None], grid, mode='bilinear',
                                padding_mode='border', align_corners=True)
        pooled.append(F.avg_pool2d(samples, 2))  # (1, C, size, size)
    return torch.cat(pooled)


@pytest.mark.parametrize('backbone', [
    dict(type='SOFT', arch='tiny', solver='exact', out_indices=(0, 1, 2, 3)),
    dict(type='UFOViT', arch='tiny', out_indices=(0, 1, 2, 3)),
])
def test_features_are_nchw_for_roi_align(backbone):
    """mmcv's CPU RoIAlign reads NCHW memory whatever the strides; a
    channels-last feature map would make it pool the wrong pixels."""
    from mmcv.ops import roi_align
    from mmengine.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(backbone).eval()
    with torch.no_grad():
        feats = model(torch.randn(2, 3, 64, 96))
    rois = torch.tensor([[0., 4., 8., 40., 30.], [1., 20., 2., 90., 60.]])
    for stride, feat in zip((4, 8, 16, 32), feats):
        assert feat.is_contiguous()
        pooled = roi_align(feat, rois, (7, 7), 1 / stride, 2, 'avg', True)
        expected = roi_align_reference(feat, rois, 7, 1 / stride)
        torch.testing.assert_close(pooled, expected)
