"""Mixup and CutMix of a batch, configured with mmpretrain's ``batch_augments``."""
import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

#: Batch augmentations by mmpretrain's names.
BATCH_AUGMENTS = ('Mixup', 'CutMix')


def cutmix_box(height: int, width: int, lam: float) -> Tuple[int, int, int, int]:
    """A box of area about ``(1 - lam) * H * W`` at a random centre, clipped.

    Returns:
        tuple[int, int, int, int]: ``(y0, y1, x0, x1)``, half-open.
    """
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(np.random.randint(0, height)), int(np.random.randint(0, width))
    y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    return int(y0), int(y1), int(x0), int(x1)


def mix_batch(inputs: torch.Tensor, targets: torch.Tensor, mixup_alpha: float = 0.8,
              cutmix_alpha: float = 1.0, switch_prob: float = 0.5,
              prob: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor, float, str]:
    """Mixup or CutMix of a batch with its reverse (one ``lam`` per batch).

    With probability ``prob`` the batch is mixed: by CutMix with probability
    ``switch_prob`` (when both alphas are positive), else by Mixup; ``lam``
    is drawn from Beta(alpha, alpha). Image ``i`` is mixed with image
    ``B - 1 - i``. Mixup: ``x = lam * x + (1 - lam) * x_rev``. CutMix: a box
    of ``x_rev`` is pasted into ``x`` and ``lam`` becomes the exact fraction
    of pixels kept. Targets are mixed with the same ``lam``.

    Args:
        inputs (Tensor): (B, C, H, W), not modified.
        targets (Tensor): (B, K) class probabilities.
        mixup_alpha (float): Beta parameter of Mixup; 0 disables it.
            Default: 0.8.
        cutmix_alpha (float): Beta parameter of CutMix; 0 disables it.
            Default: 1.0.
        switch_prob (float): Probability of CutMix when both are enabled.
            Default: 0.5.
        prob (float): Probability of mixing a batch at all. Default: 1.0.

    Returns:
        tuple: Mixed inputs, mixed targets, ``lam`` (1 when not mixed) and the
        mode (``'mixup'``, ``'cutmix'`` or ``'none'``).
    """
    if (mixup_alpha <= 0 and cutmix_alpha <= 0) or np.random.rand() >= prob:
        return inputs, targets, 1.0, 'none'
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = bool(np.random.rand() < switch_prob)
    else:
        use_cutmix = cutmix_alpha > 0
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    lam = float(np.random.beta(alpha, alpha))
    reverse = inputs.flip(0)
    if use_cutmix:
        height, width = inputs.shape[-2:]
        y0, y1, x0, x1 = cutmix_box(height, width, lam)
        mixed = inputs.clone()
        mixed[..., y0:y1, x0:x1] = reverse[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / float(height * width)
    else:
        mixed = inputs * lam + reverse * (1 - lam)
    targets = targets * lam + targets.flip(0) * (1 - lam)
    return mixed, targets, lam, 'cutmix' if use_cutmix else 'mixup'


def mix_options(augments: Sequence[dict], probs: Optional[Sequence[float]] = None
                ) -> dict:
    """mmpretrain's ``batch_augments`` -> keyword arguments of :func:`mix_batch`.

    ``augments`` lists ``dict(type='Mixup', alpha=...)`` and/or
    ``dict(type='CutMix', alpha=..., cutmix_minmax=None, correct_lam=True)``;
    one of them is drawn per batch with ``probs`` (uniform when None; when
    they sum to less than 1 the batch stays unmixed the rest of the time).

    Raises:
        ValueError: An unknown or repeated type, an argument other than
            these, ``cutmix_minmax`` or ``correct_lam=False``, or ``probs``
            that do not match ``augments``.
    """
    alphas = {}
    for augment in augments:
        augment = dict(augment)
        name = augment.pop('type', None)
        if name not in BATCH_AUGMENTS or name in alphas:
            raise ValueError(f'batch_augments type={name!r} is invalid; expected '
                             f'each of {list(BATCH_AUGMENTS)} at most once.')
        if augment.pop('cutmix_minmax', None) is not None or \
                not augment.pop('correct_lam', True):
            raise ValueError('CutMix: only cutmix_minmax=None and correct_lam=True '
                             'are supported.')
        if set(augment) != {'alpha'} or not augment['alpha'] > 0:
            raise ValueError(f'{name}: expected a single argument alpha > 0; got '
                             f'{augment}.')
        alphas[name] = float(augment['alpha'])
    if not alphas:
        raise ValueError('batch_augments needs at least one of Mixup, CutMix.')
    probs = [1 / len(alphas)] * len(alphas) if probs is None else list(probs)
    if len(probs) != len(alphas) or min(probs) < 0 or sum(probs) > 1 + 1e-6:
        raise ValueError(f'probs={probs!r} must give one probability per augment '
                         f'({len(alphas)}), summing to at most 1.')
    named = dict(zip(alphas, probs))
    total = sum(probs)
    return dict(mixup_alpha=alphas.get('Mixup', 0.),
                cutmix_alpha=alphas.get('CutMix', 0.),
                switch_prob=named.get('CutMix', 0.) / total if total else 0.,
                prob=total)
