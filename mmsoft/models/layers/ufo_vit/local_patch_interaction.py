"""Local patch interaction: depth-wise convolutions on the token grid."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ....utils import check_positive_int
from ..shared.autograd_state import records_gradient
from ..shared.layer_scale import scaled_parameters
from ..shared.valid_region import ValidShapes, mask_map


class LocalPatchInteraction(nn.Module):
    """``DWConv -> GELU -> BatchNorm -> DWConv`` on the (H, W) token grid.

    Mixes every token with its spatial neighbours, channel by channel; the
    convolutions are zero-padded to keep the grid size, so any grid works.

    This is XCiT's ``LPI`` (timm ``xcit.py``; same parameter names
    ``conv1``, ``bn``, ``conv2``, same output for its weights). Deliberate
    additions, not in XCiT: ``valid_shapes`` (in a padded batch both
    convolutions see zeros outside an image's region, so its valid tokens
    are those it has alone; XCiT mixes the padding tokens into the border
    tokens), ``out_scale`` (the block's LayerScale folded into ``conv2``,
    same result as scaling the output) and the check that the kernel is odd
    (XCiT's padding ``k // 2`` would change the grid size otherwise). See
    ``tests/test_ufo_vit_vs_xcit.py``.

    In training, backward recomputes the three intermediate maps from the
    input (all depth-wise, hence cheap) instead of keeping them; the
    recomputation normalises with the same batch statistics and does not
    update BatchNorm's running statistics a second time.

    Args:
        embed_dims (int): Token width C.
        kernel_size (int): Odd kernel size of both depth-wise convolutions.
            Default: 3.
        act_layer (type): Activation class. Default: ``nn.GELU``.
    """

    def __init__(self, embed_dims: int, kernel_size: int = 3,
                 act_layer: type = nn.GELU):
        super().__init__()
        check_positive_int('embed_dims', embed_dims)
        check_positive_int('kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f'kernel_size={kernel_size} is invalid; expected an '
                             f'odd integer so that the grid keeps its size.')
        padding = kernel_size // 2
        self.conv1 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(embed_dims)
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                               padding=padding, groups=embed_dims)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                valid_shapes: Optional[ValidShapes] = None,
                out_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Forward.

        Args:
            x (Tensor): Tokens, shape (B, N, C).
            hw_shape (tuple[int, int]): The token grid (H, W), H * W = N.
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid: both convolutions then see zeros
                outside it, as around the image alone. Default: None.
            out_scale (Tensor, optional): A LayerScale (C, ), folded into
                ``conv2`` (see :mod:`~mmsoft.models.layers.shared.layer_scale`).
                Default: None.

        Returns:
            Tensor: Shape (B, N, C).
        """
        batch, _, channels = x.shape
        x = x.transpose(1, 2).reshape(batch, channels, *hw_shape)  # (B, C, H, W)
        out_params = scaled_parameters(self.conv2, out_scale)
        if records_gradient(x, self.conv1.weight):
            passes = []  # the first pass is the forward, later ones recompute
            x = checkpoint(lambda grid: self.mix(grid, first_pass=passes.append(1)
                                                 or len(passes) == 1,
                                                 valid_shapes=valid_shapes,
                                                 out_params=out_params),
                           x, use_reentrant=False)
        else:
            x = self.mix(x, first_pass=True, valid_shapes=valid_shapes,
                         out_params=out_params)  # (B, C, H, W)
        return x.flatten(2).transpose(1, 2)  # (B, N, C)

    def mix(self, grid: torch.Tensor, first_pass: bool,
            valid_shapes: Optional[ValidShapes] = None,
            out_params: Optional[tuple] = None) -> torch.Tensor:
        """``conv2(bn(act(conv1(grid))))`` on a (B, C, H, W) map.

        Args:
            grid (Tensor): Shape (B, C, H, W).
            first_pass (bool): False when backward recomputes the forward:
                BatchNorm then normalises with the batch statistics without
                updating its running ones again.
            valid_shapes (list[tuple[int, int]], optional): Valid regions;
                each convolution's input is zeroed outside them.
                Default: None.
            out_params (tuple[Tensor, Tensor], optional): Weight and bias
                to use for ``conv2``. Default: None (its own).

        Returns:
            Tensor: Shape (B, C, H, W).
        """
        hidden = self.act(self.conv1(mask_map(grid, valid_shapes)))
        if first_pass or not self.bn.training:
            hidden = self.bn(hidden)
        else:  # the same operation, its statistics updates thrown away
            bn = self.bn
            hidden = F.batch_norm(hidden, bn.running_mean.clone(),
                                  bn.running_var.clone(), bn.weight, bn.bias,
                                  training=True, eps=bn.eps)
        weight, bias = out_params or (self.conv2.weight, self.conv2.bias)
        return F.conv2d(mask_map(hidden, valid_shapes), weight, bias,
                        padding=self.conv2.padding, groups=self.conv2.groups)
