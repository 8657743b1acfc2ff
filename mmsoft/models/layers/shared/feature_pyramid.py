"""Single-scale to four-scale adapter for isotropic (plain ViT) backbones."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ....utils import check_out_indices, check_positive_int
from ...memory_efficient.norm_act_conv import fused_conv_stack
from ...memory_efficient.switch import MemoryEfficient, takes_memory_efficient_path
from .gelu import GELU
from ...ops.valid_region import ValidShapes, mask_map, scaled_shapes, strided_shapes

NUM_SCALES = 4


class FeaturePyramidAdapter(MemoryEfficient, nn.Module):
    """Brings maps of one stride s to strides s/4, s/2, s and 2s.

    Scale 0: ``ConvTranspose2d(2, 2) -> BatchNorm -> GELU ->
    ConvTranspose2d(2, 2)`` (x4 upsampling); scale 1: one
    ``ConvTranspose2d(2, 2)`` (x2); scale 2: identity; scale 3:
    ``MaxPool2d(2, ceil_mode=True)`` (a side L becomes ceil(L / 2)). All keep
    the channel count.

    These are the branches of XCiT's detection backbone but for the
    ceil-mode pooling and a plain BatchNorm2d (``docs/ufo_vit_design.md``).

    Only the branches of ``out_indices`` are built; they live in
    ``self.branches`` under the keys ``'0'``..``'3'``.

    Args:
        embed_dims (int): Channels of the input and output maps.
        out_indices (Sequence[int]): Scales (0-3) produced.
            Default: (0, 1, 2, 3).
    """

    def __init__(self, embed_dims: int, out_indices: Sequence[int] = (0, 1, 2, 3)):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        self.out_indices = check_out_indices(out_indices, NUM_SCALES)
        self.branches = nn.ModuleDict(
            {str(i): self._branch(i, embed_dims) for i in self.out_indices})

    @staticmethod
    def _branch(scale: int, dims: int) -> nn.Module:
        if scale == 0:
            return nn.Sequential(
                nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2),
                nn.BatchNorm2d(dims), GELU(),
                nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2))
        if scale == 1:
            return nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2)
        if scale == 2:
            return nn.Identity()
        return nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)

    def forward(self, feats: Sequence[torch.Tensor],
                valid_shapes: Optional[ValidShapes] = None) -> Tuple[torch.Tensor, ...]:
        """Resamples one map per entry of ``out_indices``.

        Args:
            feats (Sequence[Tensor]): ``len(out_indices)`` maps, each of shape
                (B, C, H, W), in the order of ``out_indices``.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the (H, W) grid. Given, every output is
                what the image alone gives inside its region (the max pool
                ignores the padding) and zero outside. Default: None.

        Returns:
            tuple[Tensor]: Map ``k`` has shape (B, C, 4H, 4W), (B, C, 2H, 2W),
            (B, C, H, W) or (B, C, ceil(H/2), ceil(W/2)) for scale
            ``out_indices[k]`` = 0, 1, 2 or 3.
        """
        if len(feats) != len(self.out_indices):
            raise ValueError(f'got {len(feats)} maps; expected one per out_indices='
                             f'{self.out_indices}.')
        if valid_shapes is None:
            return tuple(self.run_branch(i, feat)
                         for i, feat in zip(self.out_indices, feats))
        return tuple(self.masked_branch(i, feat, valid_shapes)
                     for i, feat in zip(self.out_indices, feats))

    def masked_branch(self, scale: int, feat: torch.Tensor,
                      valid_shapes: ValidShapes) -> torch.Tensor:
        """Branch ``scale`` on a map whose padding must not count:
        (B, C, H, W) -> the branch's output, zero outside the regions."""
        if scale == 3:  # the max pool must not pick padded cells
            pooled = self.branches['3'](mask_map(feat, valid_shapes, float('-inf')))
            return mask_map(pooled, strided_shapes(valid_shapes, (2, )))
        factor = 2**(2 - scale)
        out = self.run_branch(scale, feat)  # (B, C, factor * H, factor * W)
        return mask_map(out, scaled_shapes(valid_shapes, factor))

    def run_branch(self, scale: int, feat: torch.Tensor) -> torch.Tensor:
        """Branch ``scale`` on ``feat``; on the memory-efficient path
        (:func:`takes_memory_efficient_path`) the x4 branch's ``BatchNorm ->
        GELU -> deconvolution`` with a plain BatchNorm2d keeps only
        BatchNorm's input for backward
        (:mod:`mmsoft.models.memory_efficient.norm_act_conv`; the other
        branches have no BatchNorm)."""
        branch = self.branches[str(scale)]
        if scale == 0 and takes_memory_efficient_path(self):
            return fused_conv_stack(branch, feat)
        return branch(feat)
