"""A config's library and default input size, and its model run end to end."""
from typing import Tuple

import torch
import torch.nn as nn
from mmengine.config import Config

DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512)}


def config_scope(cfg: Config) -> str:
    """The library a config belongs to, from its ``default_scope``."""
    scope = cfg.get('default_scope', None)
    if scope not in DEFAULT_SHAPES:
        raise ValueError(f'default_scope={scope!r} of the config is not supported; '
                         f'expected one of {list(DEFAULT_SHAPES)}.')
    return scope


class TensorModeModel(nn.Module):
    """Wraps a detector or segmentor so that ``forward(images)`` runs the
    network end to end (backbone, neck, heads) without post-processing.

    Args:
        model (nn.Module): An mmdet detector or mmseg segmentor.
        scope (str): ``'mmdet'`` or ``'mmseg'``.
        shape (tuple[int, int]): Input (H, W), for the detectors' metadata.
    """

    def __init__(self, model: nn.Module, scope: str, shape: Tuple[int, int]):
        super().__init__()
        self.model = model
        self.data_samples = None
        if scope == 'mmdet':
            from mmdet.structures import DetDataSample
            meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                        batch_input_shape=shape, scale_factor=(1., 1.))
            self.data_samples = [DetDataSample(metainfo=meta)]

    def forward(self, images: torch.Tensor):
        """Raw head outputs for ``images`` (1, 3, H, W)."""
        return self.model._forward(images, self.data_samples)
