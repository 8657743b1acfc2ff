"""mmdet / mmseg backbones around the plain-PyTorch models.

The classes add OpenMMLab's conventions to :class:`mmsoft.models.SOFT` and
:class:`mmsoft.models.UFOViT` without changing their parameters:
``frozen_stages``, ``norm_eval``, ``with_cp``, ``init_cfg`` (``'Pretrained'``
loads strictly) and a ``forward`` that returns the ``out_indices`` maps. The
valid-region data preprocessors record each image's region for the padded
batch they return (keyed by the tensor, held weakly); the backbones look it up.
"""
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint import load_soft_checkpoint, load_ufo_vit_checkpoint
from ..models import soft, ufo_vit
from ..models.common import check_valid_shapes
from ..utils import check_frozen_stages

_RECORDS: Dict[int, Tuple[weakref.ref, List[Tuple[int, int]]]] = {}


def register_valid_shapes(inputs: torch.Tensor, valid_shapes: Sequence) -> None:
    """Records each image's valid (h, w) for the padded batch ``inputs``
    (checked as :func:`~mmsoft.models.common.check_valid_shapes` checks it)."""
    shapes = check_valid_shapes(valid_shapes, inputs.shape)
    key = id(inputs)
    _RECORDS[key] = (weakref.ref(inputs, lambda _: _RECORDS.pop(key, None)), shapes)


def registered_valid_shapes(inputs: torch.Tensor) -> Optional[List[Tuple[int, int]]]:
    """The valid shapes recorded for exactly this tensor, or None."""
    record = _RECORDS.get(id(inputs))
    if record is None or record[0]() is not inputs:
        return None
    return list(record[1])


class ValidRegionMixin:
    """Mixed in before an mmdet/mmseg data preprocessor: records each sample's
    ``img_shape`` for the padded batch it returns."""

    def forward(self, data: dict, training: bool = False) -> Dict[str, Any]:
        data = super().forward(data, training)
        inputs, samples = data['inputs'], data.get('data_samples')
        if isinstance(inputs, torch.Tensor) and samples:
            register_valid_shapes(inputs, [tuple(sample.metainfo['img_shape'][:2])
                                           for sample in samples])
        return data


class OpenMMLabBackbone:
    """mmdet's backbone conventions, mixed in before a model class:
    ``frozen_stages`` (-1: none, 0: the stem, k: the stem and stages 1..k),
    ``norm_eval``, ``with_cp`` and ``init_cfg`` (``'Pretrained'`` loads strictly)."""

    def __init__(self, *args, frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, init_cfg: Optional[dict] = None, **kwargs):
        super().__init__(*args, **kwargs)
        check_frozen_stages(frozen_stages, 4)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.init_cfg = init_cfg
        self.set_grad_checkpointing(with_cp)

    def stage_parts(self, stage: int) -> list:
        """Modules and parameters of stage ``stage`` (0: the stem)."""
        raise NotImplementedError

    def load_pretrained(self, cfg: dict) -> None:
        raise NotImplementedError

    def init_weights(self) -> None:
        """Loads ``init_cfg``'s checkpoint, or initialises from scratch."""
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self.load_pretrained(cfg)
        else:
            super().init_weights()
        self.freeze_stages()

    def forward(self, x: torch.Tensor, valid_shapes: Optional[Sequence] = None
                ) -> Tuple[torch.Tensor, ...]:
        """The maps of ``out_indices``; ``valid_shapes`` default to those a
        valid-region data preprocessor recorded for ``x``."""
        if valid_shapes is None:
            valid_shapes = registered_valid_shapes(x)
        return tuple(self.forward_intermediates(x, self.out_indices,
                                                intermediates_only=True,
                                                valid_shapes=valid_shapes))

    def freeze_stages(self) -> None:
        """Stops gradients of the frozen stages and puts them in eval mode."""
        for stage in range(self.frozen_stages + 1):
            for part in self.stage_parts(stage):
                if isinstance(part, nn.Parameter):
                    part.requires_grad = False
                    continue
                part.eval()
                for param in part.parameters():
                    param.requires_grad = False

    def train(self, mode: bool = True):
        """Train mode, keeping frozen stages and (with norm_eval) BN in eval."""
        super().train(mode)
        self.freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self


class SOFT(OpenMMLabBackbone, soft.SOFT):
    """:class:`mmsoft.models.SOFT` as an mmdet/mmseg backbone;
    ``convert_weights``: ``init_cfg``'s checkpoint is an official one."""

    def __init__(self, *args, convert_weights: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.convert_weights = convert_weights

    def stage_parts(self, stage: int) -> list:
        if stage == 0:
            return [self.stages[0].patch_embed]
        return [self.stages[stage - 1]]

    def load_pretrained(self, cfg: dict) -> None:
        grids = {f'stages.{i}.pos_embed': (stage.pos_grid, stage.extra_tokens)
                 for i, stage in enumerate(self.stages)}
        load_soft_checkpoint(self, cfg['checkpoint'],
                             convert_weights=self.convert_weights,
                             prefix=cfg.get('prefix'),
                             map_location=cfg.get('map_location', 'cpu'),
                             pos_embed_grids=grids,
                             resize_pos_embed=soft.resize_pos_embed,
                             variant=self.variant)


class UFOViT(OpenMMLabBackbone, ufo_vit.UFOViT):
    """:class:`mmsoft.models.UFOViT` as an mmdet/mmseg backbone; stage k
    (1-4) is the k-th quarter of the blocks with its pyramid branch."""

    def stage_parts(self, stage: int) -> list:
        if stage == 0:
            return [self.patch_embed, self.pos_embed]
        start = self.stage_ends[stage - 2] if stage > 1 else 0
        parts = list(self.blocks[start:self.stage_ends[stage - 1]])
        if self.pyramid is not None and str(stage - 1) in self.pyramid.branches:
            parts.append(self.pyramid.branches[str(stage - 1)])
        return parts

    def load_pretrained(self, cfg: dict) -> None:
        load_ufo_vit_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                map_location=cfg.get('map_location', 'cpu'))
