"""Cross-entropy against class-probability targets, with mmpretrain's loss names.

:class:`LabelSmoothLoss` and :class:`CrossEntropyLoss` take mmpretrain 1.x's
arguments (the supported subset), so a head config written for either library
builds here; unsupported arguments raise.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS

from ..utils import check_choice

#: Reductions of the per-sample losses.
REDUCTIONS = ('none', 'mean', 'sum')


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                       label_smoothing: float = 0.,
                       reduction: str = 'mean') -> torch.Tensor:
    """Cross-entropy against class-probability targets, with label smoothing.

    ``targets`` are smoothed as ``t * (1 - eps) + eps / K`` before the loss
    ``-sum(t * log_softmax(logits))``. For mixed targets
    ``lam * y1 + (1 - lam) * y2`` (Mixup/CutMix) this equals mixing the
    smoothed one-hot vectors, as timm's ``Mixup(label_smoothing=eps)``
    followed by ``SoftTargetCrossEntropy`` computes.

    Args:
        logits (Tensor): Shape (B, K).
        targets (Tensor): Shape (B, K), rows summing to 1; or (B, ) class
            indices.
        label_smoothing (float): ``eps`` in [0, 1). Default: 0.
        reduction (str): ``'mean'`` over the batch, ``'sum'`` or ``'none'``
            (per-sample losses, shape (B, )). Default: ``'mean'``.

    Returns:
        Tensor: Scalar loss, or (B, ) for ``reduction='none'``.
    """
    num_classes = logits.shape[-1]
    if targets.dim() == 1:
        targets = F.one_hot(targets.long(), num_classes)
    targets = targets.to(logits.dtype)
    if label_smoothing > 0:
        targets = targets * (1 - label_smoothing) + label_smoothing / num_classes
    losses = -(targets * F.log_softmax(logits, dim=-1)).sum(-1)  # (B, )
    if reduction == 'mean':
        return losses.mean()
    return losses.sum() if reduction == 'sum' else losses


def _reject_unsupported(loss_name: str, **arguments) -> None:
    """Raises for mmpretrain arguments set to a value this module lacks."""
    for name, (value, supported) in arguments.items():
        if value != supported:
            raise ValueError(f'{loss_name}: {name}={value!r} is not supported; only '
                             f'{name}={supported!r}.')


@MODELS.register_module()
class CrossEntropyLoss(nn.Module):
    """Softmax cross-entropy of logits against labels or soft targets.

    mmpretrain's ``CrossEntropyLoss``; ``use_soft`` is accepted for config
    compatibility: both class indices (B, ) and probability targets (B, K)
    are always handled.

    Args:
        use_sigmoid (bool): Only False (softmax). Default: False.
        use_soft (bool): Targets may be probability vectors. Default: False.
        reduction (str): ``'mean'``, ``'sum'`` or ``'none'``. Default:
            ``'mean'``.
        loss_weight (float): Factor of the loss. Default: 1.
        class_weight: Only None. Default: None.
        pos_weight: Only None. Default: None.
    """

    def __init__(self, use_sigmoid: bool = False, use_soft: bool = False,
                 reduction: str = 'mean', loss_weight: float = 1.0,
                 class_weight=None, pos_weight=None):
        super().__init__()
        _reject_unsupported(type(self).__name__, use_sigmoid=(use_sigmoid, False),
                            class_weight=(class_weight, None),
                            pos_weight=(pos_weight, None))
        check_choice('reduction', reduction, REDUCTIONS)
        self.use_soft = use_soft
        self.reduction = reduction
        self.loss_weight = loss_weight
        self.label_smoothing = 0.

    def forward(self, cls_score: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) and labels (B, ) or targets (B, K) -> loss."""
        return self.loss_weight * soft_cross_entropy(cls_score, label,
                                                     self.label_smoothing,
                                                     self.reduction)


@MODELS.register_module()
class LabelSmoothLoss(CrossEntropyLoss):
    """Cross-entropy against label-smoothed targets (mmpretrain's name).

    Targets (one-hot labels or mixed probability vectors) become
    ``t * (1 - eps) + eps / K`` (mmpretrain's ``mode='original'``).

    Args:
        label_smooth_val (float): ``eps`` in [0, 1).
        num_classes (int, optional): Checked against the logits when given.
            Default: None.
        use_sigmoid (bool): Only None or False. Default: None.
        mode (str): Only ``'original'``. Default: ``'original'``.
        reduction (str): ``'mean'``, ``'sum'`` or ``'none'``. Default:
            ``'mean'``.
        loss_weight (float): Factor of the loss. Default: 1.
        class_weight: Only None. Default: None.
        pos_weight: Only None. Default: None.
    """

    def __init__(self, label_smooth_val: float, num_classes: Optional[int] = None,
                 use_sigmoid: Optional[bool] = None, mode: str = 'original',
                 reduction: str = 'mean', loss_weight: float = 1.0,
                 class_weight=None, pos_weight=None):
        super().__init__(use_sigmoid=bool(use_sigmoid), use_soft=True,
                         reduction=reduction, loss_weight=loss_weight,
                         class_weight=class_weight, pos_weight=pos_weight)
        check_choice('mode', mode, ('original', ))
        if not isinstance(label_smooth_val, (int, float)) or \
                not 0 <= label_smooth_val < 1:
            raise ValueError(f'label_smooth_val={label_smooth_val!r} is invalid; '
                             f'expected a value in [0, 1).')
        self.label_smoothing = float(label_smooth_val)
        self.num_classes = num_classes

    def forward(self, cls_score: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) and labels (B, ) or targets (B, K) -> loss."""
        if self.num_classes is not None and cls_score.shape[-1] != self.num_classes:
            raise ValueError(f'num_classes={self.num_classes} but the logits have '
                             f'{cls_score.shape[-1]} classes.')
        return super().forward(cls_score, label)
