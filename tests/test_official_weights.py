"""The SOFT++ configs load an official (fudan-zvg/SOFT) checkpoint in one line,
and the wrong file is refused with an error that says what is wrong.

The official files are generated here in the reference key layout
(``tests/official_soft_reference.py``); nothing is downloaded.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import argparse
import copy
import functools
import logging
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import MODELS

from mmsoft.checkpoint import soft_official_to_mmsoft
from mmsoft.models.soft import ARCH_SETTINGS
from tests.helpers import official_soft_reference as ref

pytestmark = pytest.mark.openmmlab

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
TINY_CONFIG = 'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py'
SMALL_CONFIG = 'configs/soft/mask-rcnn_soft++-small_fpn_1x_coco.py'


@pytest.fixture(scope='module')
def official_tiny():
    """Random SOFT-tiny weights in the official layout, classifier included."""
    return ref.random_official_state_dict(seed=0)


@functools.lru_cache(maxsize=None)
def backbone_cfg(config: str):
    """The backbone settings of ``config`` (parsed once: read, never change)."""
    return Config.fromfile(osp.join(REPO, config)).model.backbone


def config_backbone(config: str, checkpoint: str, **overrides):
    """The config's backbone with ``init_cfg.checkpoint`` set to ``checkpoint``
    (everything else as the config says), weights not loaded yet."""
    cfg = copy.deepcopy(backbone_cfg(config))
    cfg.update(overrides)
    cfg.init_cfg.checkpoint = checkpoint
    return MODELS.build(cfg)


class RecordList(logging.Handler):
    """Keeps the messages logged while attached."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def init_and_record_warnings(model):
    """Runs ``model.init_weights()``; returns the warnings mmengine logged."""
    logger = MMLogger.get_current_instance()
    handler = RecordList()
    logger.addHandler(handler)
    try:
        model.init_weights()
    finally:
        logger.removeHandler(handler)
    return handler.messages


def test_config_names_an_official_file_and_converts_it():
    cfg = backbone_cfg(TINY_CONFIG)
    assert cfg.convert_weights is True
    assert cfg.init_cfg == dict(type='Pretrained',
                                checkpoint='pretrained/soft_tiny_norm.pth')


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_official_file_loads_through_the_config(official_tiny, tmp_path):
    # Saved as a timm training checkpoint under the name the config expects.
    path = tmp_path / 'soft_tiny_norm.pth'
    torch.save({'state_dict': official_tiny, 'epoch': 299,
                'args': argparse.Namespace(model='soft_norm_tiny')}, path)
    model = config_backbone(TINY_CONFIG, str(path))
    assert init_and_record_warnings(model) == []
    expected, _ = soft_official_to_mmsoft(official_tiny)
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_tiny_file_in_small_config_lists_the_missing_blocks(official_tiny, tmp_path):
    path = tmp_path / 'soft_small_norm.pth'
    torch.save(official_tiny, path)
    model = config_backbone(SMALL_CONFIG, str(path))
    with pytest.raises(ValueError) as err:
        model.init_weights()
    message = str(err.value)
    assert 'does not fit the SOFT backbone' in message
    # small has 3 stage-2 blocks where tiny has 2, 20 stage-3 blocks where
    # tiny has 3, ...: the first 30 missing keys are listed, then a count.
    assert ARCH_SETTINGS['small']['depths'][1] == 3
    assert 'missing keys: stages.1.blocks.2.' in message
    assert 'more)' in message


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_plain_soft_file_in_a_soft_plus_plus_config_is_reported(official_tiny,
                                                                tmp_path):
    # The variants have the same tensors; the metadata tells them apart.
    path = tmp_path / 'soft_tiny_norm.pth'
    torch.save({'state_dict': official_tiny,
                'args': argparse.Namespace(model='soft_tiny')}, path)
    model = config_backbone(TINY_CONFIG, str(path))
    warnings = init_and_record_warnings(model)
    assert len(warnings) == 1
    assert str(path) in warnings[0]
    assert "holds 'soft' weights" in warnings[0]
    assert "variant='soft++'" in warnings[0]


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_classifier_file_under_the_detector_key_path_is_refused(official_tiny,
                                                                tmp_path):
    path = tmp_path / 'soft_tiny_norm.pth'
    torch.save(official_tiny, path)
    model = config_backbone(TINY_CONFIG, str(path))
    model.init_cfg['prefix'] = 'backbone.'
    with pytest.raises(ValueError, match=r"no keys starting with 'backbone\.'") as err:
        model.init_weights()
    # The file is named, and what its keys start with instead.
    assert str(path) in str(err.value)
    assert 'patch_embed1.' in str(err.value)


@pytest.fixture()
def detector_checkpoint(official_tiny, tmp_path):
    """An mmdet Mask R-CNN checkpoint whose backbone is SOFT++-tiny (mmsoft
    layout under ``backbone.``, a neck and heads beside it)."""
    backbone, _ = soft_official_to_mmsoft(official_tiny)
    state_dict = {f'backbone.{k}': v for k, v in backbone.items()}
    state_dict['neck.lateral_convs.0.conv.weight'] = torch.zeros(256, 64, 1, 1)
    state_dict['rpn_head.rpn_conv.weight'] = torch.zeros(256, 256, 3, 3)
    path = tmp_path / 'mask-rcnn_soft++-tiny_epoch_12.pth'
    torch.save({'state_dict': state_dict, 'meta': dict(epoch=12)}, path)
    return str(path), backbone


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_detector_file_as_official_pretrain_is_refused(detector_checkpoint):
    path, _ = detector_checkpoint
    model = config_backbone(TINY_CONFIG, path)
    with pytest.raises(ValueError) as err:
        model.init_weights()
    message = str(err.value)
    assert 'not part of a reference SOFT model' in message
    assert 'neck.lateral_convs.0.conv.weight' in message
    assert 'convert_weights=False' in message


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_detector_file_loads_as_mmsoft_layout_with_its_prefix(detector_checkpoint):
    path, backbone = detector_checkpoint
    model = config_backbone(TINY_CONFIG, path, convert_weights=False)
    model.init_cfg['prefix'] = 'backbone.'
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, backbone[key]), key
