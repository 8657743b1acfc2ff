"""SOFT-tiny trains inside mmdet's Mask R-CNN and mmseg's UperNet."""
import pytest
import torch

from mmsoft.testing import (backbone_grad_norm, build_mask_rcnn, build_upernet,
                            demo_seg_inputs, detector_train_step,
                            segmentor_train_step)

SOFT_TINY = dict(type='SOFT', arch='tiny', attention='soft++', solver='exact')
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
        # Reference: the same map rebuilt element by element from its values.
        fresh = feat.detach().clone(memory_format=torch.contiguous_format)
        expected = roi_align(fresh, rois, (7, 7), 1 / stride, 2, 'avg', True)
        torch.testing.assert_close(pooled, expected, rtol=0, atol=0)
