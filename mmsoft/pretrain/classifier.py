"""An image classifier made of a registered backbone and head."""
from typing import Dict, List, Optional, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement


@MODELS.register_module()
class BackboneClassifier(BaseModel):
    """``head(backbone(images))`` with mmengine's model interface.

    ``forward(inputs, data_samples, mode)`` with ``mode='loss'`` returns the
    head's losses, ``'predict'`` the data samples with ``pred_score`` and
    ``pred_label``, ``'tensor'`` the class logits. The state dict holds the
    backbone under ``backbone.`` and the head under ``head.``, as
    ``tools/model_converters/ufo_vit_cls2backbone.py`` expects.

    Args:
        backbone (dict): Backbone config, e.g. ``dict(type='UFOViT',
            arch='small', out_indices=(3, ))``.
        head (dict): Head config with ``loss``/``predict`` methods, e.g.
            ``dict(type='ClassAttentionHead', ...)``; it reads the backbone's
            outputs.
        data_preprocessor (dict, optional): e.g.
            ``dict(type='ClsDataPreprocessor', ...)``.
        skip_final_pool (bool): For backbones whose last output is a
            parameter-free pooling of the last block (``UFOViT`` with
            ``out_indices=(3, )``: a 2x2 max-pool of the stride-16 tokens),
            replace that pooling by the identity, so that the head reads every
            token of the last block (as XCiT's class attention does). The
            state dict does not change. Default: False.
        init_cfg (dict, optional): Initialization config. Default: None.
    """

    def __init__(self,
                 backbone: dict,
                 head: dict,
                 data_preprocessor: Optional[dict] = None,
                 skip_final_pool: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        self.head = MODELS.build(head)
        self.skip_final_pool = skip_final_pool
        if skip_final_pool:
            self._remove_final_pool()

    def _remove_final_pool(self) -> None:
        """Replaces the parameter-free resampler of the only output by identity."""
        pyramid = getattr(self.backbone, 'pyramid', None)
        branches = getattr(pyramid, 'branches', None)
        if not isinstance(branches, nn.ModuleDict) or len(branches) != 1:
            raise ValueError(
                f'skip_final_pool=True needs a backbone with a single resampled '
                f'output (e.g. UFOViT with out_indices=(3, )); '
                f'{type(self.backbone).__name__} has '
                f'{list(branches) if isinstance(branches, nn.ModuleDict) else "none"}.')
        (name, branch), = branches.items()
        if any(True for _ in branch.parameters()) or any(True for _ in
                                                          branch.buffers()):
            raise ValueError(f'skip_final_pool=True: output {name} of the backbone is '
                             f'resampled by {type(branch).__name__}, which has '
                             f'weights; only a parameter-free pooling can be '
                             f'skipped.')
        branches[name] = nn.Identity()

    def extract_feat(self, inputs: torch.Tensor):
        """Backbone outputs of a normalised batch (B, 3, H, W)."""
        return self.backbone(inputs)

    def forward(self,
                inputs: torch.Tensor,
                data_samples: Optional[List[BaseDataElement]] = None,
                mode: str = 'tensor'
                ) -> Union[Dict[str, torch.Tensor], List[BaseDataElement],
                           torch.Tensor]:
        """Losses (``'loss'``), predictions (``'predict'``) or logits (``'tensor'``).

        Args:
            inputs (Tensor): Normalised images, (B, 3, H, W).
            data_samples (list[BaseDataElement], optional): Targets
                (``gt_label``, ``gt_score``); needed for ``'loss'``.
            mode (str): ``'loss'``, ``'predict'`` or ``'tensor'``.
        """
        feats = self.extract_feat(inputs)
        if mode == 'loss':
            if data_samples is None:
                raise ValueError("mode='loss' needs data_samples with gt_label.")
            return self.head.loss(feats, data_samples)
        if mode == 'predict':
            return self.head.predict(feats, data_samples)
        if mode == 'tensor':
            return self.head(feats)
        raise ValueError(f"mode={mode!r} is invalid; expected 'loss', 'predict' or "
                         f"'tensor'.")
