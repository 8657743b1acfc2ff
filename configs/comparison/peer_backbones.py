"""Backbone wrappers that the comparison's peer configs build.

Not a config: the peer configs import it through ``custom_imports`` as
``configs.comparison.peer_backbones``, which resolves from the repository root
(``tools/train.py``, ``tools/test.py`` and ``tools/analysis/`` put the root on
``sys.path``), as mmdet's ``projects/`` configs import their modules.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.registry import MODELS

from mmsoft.models.ufo_vit import FeaturePyramidAdapter


@MODELS.register_module()
class IsotropicPyramid(BaseModule):
    """A single-stride trunk's maps resampled to strides 4, 8, 16 and 32.

    The resampling is XCiT's detection neck-in-backbone, the same as
    UFO-ViT's: the branches of :class:`~mmsoft.models.ufo_vit.FeaturePyramidAdapter`
    (x4: deconvolution, BatchNorm, GELU, deconvolution; x2: deconvolution;
    identity; max pool), run with plain autograd (not the adapter's
    memory-saving ``BatchNorm -> GELU -> deconvolution`` function, which is
    mmsoft's own), so the peer costs what XCiT's code costs.

    Registered in mmengine's ``MODELS`` as ``IsotropicPyramid`` when this
    module is imported (``custom_imports`` of
    ``configs/comparison/mask-rcnn_xcit-t12_fpn_demo.py``).

    Args:
        trunk (nn.Module | dict): Returns four (B, C, H, W) maps of one
            stride, e.g. ``TIMMBackbone(..., features_only=True)`` of an
            isotropic model; a dict is built by ``MODELS``.
        embed_dims (int): C.
        init_cfg (dict, optional): mmengine's initialisation config.
            Default: None.
    """

    def __init__(self, trunk: Union[nn.Module, dict], embed_dims: int,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        self.trunk = MODELS.build(trunk) if isinstance(trunk, dict) else trunk
        self.pyramid = FeaturePyramidAdapter(embed_dims, (0, 1, 2, 3))

    def init_weights(self) -> None:
        """The trunk's own initialisation (timm initialises on construction);
        the resampling branches keep PyTorch's defaults."""
        if hasattr(self.trunk, 'init_weights'):
            self.trunk.init_weights()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> maps at strides 4, 8, 16 and 32 of the trunk's
        stride-16 grid (h, w): (4h, 4w), (2h, 2w), (h, w), (ceil(h/2),
        ceil(w/2))."""
        feats: Sequence[torch.Tensor] = self.trunk(x)
        if len(feats) != 4:
            raise ValueError(f'the trunk gave {len(feats)} maps; expected 4.')
        return tuple(self.pyramid.branches[str(i)](feat)
                     for i, feat in enumerate(feats))
