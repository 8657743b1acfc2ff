"""What the multi-stage backbones share: freezing, norm_eval, checkpointing."""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ...utils import check_frozen_stages, check_image_batch
from ..ops.contiguous_gradient import contiguous_gradient
from ..layers.shared.mlp import MLP
from ..ops.valid_region import ValidShapes, check_valid_shapes
from ..memory_efficient import set_memory_efficient
from ..memory_efficient.recompute import recomputed
from ..valid_region_record import registered_valid_shapes


def tokens_to_map(tokens: torch.Tensor, hw_shape) -> torch.Tensor:
    """Tokens on an (H, W) grid as a contiguous feature map.

    The tokens' gradient is handed back token-major
    (:func:`~mmsoft.models.ops.contiguous_gradient.contiguous_gradient`),
    as the norms before expect it. A bare ``transpose`` would give a
    channels-last view. Downstream mmcv ops
    need NCHW memory: the CPU kernel of ``RoIAlign`` reads the buffer as NCHW
    whatever the strides, so on a channels-last map it pools wrong values
    (and a detector trained on them does not learn).

    Args:
        tokens (Tensor): Shape (B, H * W, C).
        hw_shape (tuple[int, int]): The grid (H, W).

    Returns:
        Tensor: Shape (B, C, H, W), contiguous.
    """
    batch, _, channels = tokens.shape
    tokens = contiguous_gradient(tokens)
    return tokens.transpose(1, 2).reshape(batch, channels, *hw_shape).contiguous()


class MultiStageBackbone(BaseModule):
    """Base of the backbones: the OpenMMLab conventions in one place.

    Subclasses list what belongs to each stage in :meth:`stage_parts` and
    implement their own initialisation in :meth:`init_from_scratch`.

    Args:
        in_channels (int): Channels of the input image.
        num_stages (int): Number of freezable stages.
        frozen_stages (int): Stages whose parameters are frozen and whose
            norm layers stay in eval mode; -1 freezes nothing. Default: -1.
        norm_eval (bool): Keep BatchNorm layers in eval mode while training
            (running statistics frozen). Default: False.
        with_cp (bool): Checkpoint each block to save memory at the cost of
            recomputation. Default: False.
        min_input_size (int): Smallest accepted image side. Default: 32.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...)``
            loads weights; otherwise the model's own initialisation is used.
    """

    def __init__(self, in_channels: int, num_stages: int, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False,
                 min_input_size: int = 32, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        check_frozen_stages(frozen_stages, num_stages)
        self.in_channels = in_channels
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.min_input_size = min_input_size

    def select_memory_path(self, memory_efficient: bool, recompute_mlp: bool) -> None:
        """Sets the training path of every layer; called once the layers exist.

        Args:
            memory_efficient (bool): True: each layer's memory-efficient path
                (:mod:`mmsoft.models.memory_efficient`: the same outputs and
                gradients, less kept for backward); False: plain autograd.
            recompute_mlp (bool): Each MLP's backward also recomputes its
                hidden layer (C per token kept instead of 4C more, for one
                more ``fc1`` matmul per MLP); needs ``memory_efficient``.

        Raises:
            ValueError: ``recompute_mlp`` without ``memory_efficient``.
        """
        if recompute_mlp and not memory_efficient:
            raise ValueError(f'recompute_mlp={recompute_mlp!r} needs '
                             f'memory_efficient=True (plain autograd keeps every '
                             f'hidden layer); got memory_efficient='
                             f'{memory_efficient!r}.')
        set_memory_efficient(self, memory_efficient)
        for module in self.modules():
            if isinstance(module, MLP):
                module.keep_hidden = not recompute_mlp

    def stage_parts(self, stage: int) -> List:
        """Modules and parameters frozen by ``frozen_stages``.

        ``stage`` 0 is the stem (the first patch embedding); stage ``i >= 1``
        is everything of the i-th stage.
        """
        raise NotImplementedError

    def init_from_scratch(self) -> None:
        """Initialisation used when ``init_cfg`` loads no checkpoint."""
        raise NotImplementedError

    def load_pretrained(self, init_cfg: dict) -> None:
        """Loads the checkpoint of a ``Pretrained`` ``init_cfg`` strictly.

        Args:
            init_cfg (dict): ``dict(type='Pretrained', checkpoint=...,
                prefix=None, map_location='cpu')``.
        """
        raise NotImplementedError

    def init_weights(self) -> None:
        """Loads ``init_cfg``'s checkpoint, or initialises from scratch."""
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self.load_pretrained(cfg)
        else:
            self.init_from_scratch()
        self.freeze_stages()

    def check_input(self, x: torch.Tensor) -> None:
        """Raises ``ValueError`` for a wrong channel count or a too small image."""
        check_image_batch(x, self.in_channels, self.min_input_size)

    def resolve_valid_shapes(self, x: torch.Tensor,
                             valid_shapes: Optional[Sequence] = None
                             ) -> Optional[ValidShapes]:
        """The valid regions the forward pass uses, or None (all valid).

        mmdet and mmseg pad each image of a batch at the bottom and right.
        Told each image's valid region, the backbones compute its features
        as if it were alone. Regions come from ``valid_shapes`` or, when it
        is None, from a valid-region data preprocessor
        (``type='ValidRegionDetDataPreprocessor'`` or
        ``'ValidRegionSegDataPreprocessor'``, which every mmsoft config
        uses). Without either, every pixel of the batch counts as image,
        padding included: the behaviour of the plain preprocessors.

        Args:
            x (Tensor): Images, shape (B, C, H, W).
            valid_shapes (Sequence, optional): One (h, w) per image; None
                takes those a valid-region data preprocessor recorded for
                ``x`` (see :mod:`~mmsoft.models.valid_region_record`), if any.

        Returns:
            list[tuple[int, int]] | None: None when no region is known or
            every image fills the batch.

        Raises:
            ValueError: If ``valid_shapes`` does not fit ``x``.
        """
        if valid_shapes is None:
            valid_shapes = registered_valid_shapes(x)
        if valid_shapes is None:
            return None
        shapes = check_valid_shapes(valid_shapes, x.shape)
        if all(shape == tuple(x.shape[-2:]) for shape in shapes):
            return None
        return shapes

    def forward(self, x: torch.Tensor,
                valid_shapes: Optional[Sequence[Tuple[int, int]]] = None
                ) -> Tuple[torch.Tensor, ...]:
        """Multi-scale features.

        Valid regions are optional (see :meth:`resolve_valid_shapes`); with
        none, padding is image content. With them, each image's features are
        those it has alone (how, each backbone's ``forward_features`` says)
        and the maps are zero outside the regions.

        Args:
            x (Tensor): Images, shape (B, in_channels, H, W), H, W >=
                ``min_input_size``.
            valid_shapes (Sequence[tuple[int, int]], optional): Each image's
                valid (h, w) in pixels, the top-left region of its canvas.
                Default: None (the record for ``x``, if any; else all valid).

        Returns:
            tuple[Tensor]: One map per entry of ``out_indices`` (sizes in
            the class docstring).
        """
        self.check_input(x)
        return self.forward_features(x, self.resolve_valid_shapes(x, valid_shapes))

    def forward_features(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes]
                         ) -> Tuple[torch.Tensor, ...]:
        """:meth:`forward` on checked images and resolved regions (None
        when every image fills the batch)."""
        raise NotImplementedError

    def run_block(self, block: nn.Module, x: torch.Tensor, *args) -> torch.Tensor:
        """Runs ``block(x, *args)``, checkpointed when ``with_cp`` and training
        (its rerun in backward updates no BatchNorm statistics)."""
        if self.with_cp and self.training and x.requires_grad:
            return recomputed(block, x, *args)
        return block(x, *args)

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
        """Sets train mode, keeping frozen stages and (with norm_eval) BN in eval."""
        super().train(mode)
        self.freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self
