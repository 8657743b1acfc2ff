"""Layers whose backward recomputes their intermediate tensors.

``torch.utils.checkpoint`` (non-reentrant) keeps a function's inputs
instead of the tensors its operations would keep, and backward runs the
function again to rebuild them. Two of UFO-ViT's layers run that way:

* UFO attention (:func:`recomputed`): the attention function keeps Q, K
  and V (views of the QKV projection's output, kept anyway); backward
  recomputes their float32 copies, ``K^T V`` and both XNorms.
* The local patch interaction (:func:`recomputed_local_mixing`): its
  ``DWConv -> act -> BatchNorm -> DWConv`` keeps only its input grid;
  backward recomputes the three intermediate maps (all depth-wise, hence
  cheap). A BatchNorm in training updates its running statistics at every
  call, so the recomputation is told from the forward pass
  (:class:`FirstPassFlag`): it normalises with the same batch statistics
  (:func:`batch_norm_without_update`) and updates nothing.
"""
from functools import partial
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..layers.shared.valid_region import ValidShapes


def recomputed(function: Callable, *args):
    """``function(*args)`` keeping only ``args`` for backward, which runs
    ``function`` again (``function`` must not update any state)."""
    return checkpoint(function, *args, use_reentrant=False)


class FirstPassFlag:
    """True at its first call (the forward pass), False at every later one
    (the recomputations of backward)."""

    def __init__(self):
        self.called = False

    def __call__(self) -> bool:
        first = not self.called
        self.called = True
        return first


def batch_norm_without_update(norm: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` computed again: in training, normalised with the batch
    statistics and copies of the running ones, so those of ``norm`` are not
    updated a second time; in eval mode ``norm(x)`` (which updates nothing).

    Not :func:`~.norm_act_conv.normalise_like_forward`, which passes no
    running statistics in training: this saves for backward exactly the
    tensors ``norm(x)`` saves, as the checkpoint's recomputation must.
    """
    if not norm.training:
        return norm(x)
    return F.batch_norm(x, norm.running_mean.clone(), norm.running_var.clone(),
                        norm.weight, norm.bias, training=True, eps=norm.eps)


def conv2d_with(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``conv(x)`` (zero padding) with the given weight and bias.

    ``F.conv2d``, which autocast casts, unlike the ``torch.convolution`` of
    :func:`~.norm_act_conv.convolution` (run with autocast off)."""
    return F.conv2d(x, weight, bias, padding=conv.padding, groups=conv.groups)


def recomputed_local_mixing(lpi: nn.Module, grid: torch.Tensor,
                            valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
    """A local patch interaction's ``conv2(conv2_input(grid))`` keeping only
    ``grid`` for backward.

    ``conv2``'s weight and bias are those of this call, also in the
    recomputation (they are replaced while the call runs where a LayerScale
    is folded into them, :mod:`.layer_scale`).

    Args:
        lpi (LocalPatchInteraction): The layer (``conv2_input``, ``bn``,
            ``conv2``).
        grid (Tensor): Shape (B, C, H, W).
        valid_shapes (list[tuple[int, int]], optional): Valid regions, as
            in ``lpi.conv2_input``. Default: None.

    Returns:
        Tensor: Shape (B, C, H, W).
    """
    conv2_weight, conv2_bias = lpi.conv2.weight, lpi.conv2.bias
    first_pass = FirstPassFlag()

    def mixing(grid: torch.Tensor) -> torch.Tensor:
        norm = lpi.bn if first_pass() else partial(batch_norm_without_update, lpi.bn)
        hidden = lpi.conv2_input(grid, valid_shapes, norm)  # (B, C, H, W)
        return conv2d_with(lpi.conv2, hidden, conv2_weight, conv2_bias)

    return recomputed(mixing, grid)
