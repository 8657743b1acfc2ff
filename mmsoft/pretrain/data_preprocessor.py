"""Batch preparation for classification: normalisation, erasing, Mixup/CutMix."""
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.model import BaseDataPreprocessor
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

#: ImageNet mean and std of RGB pixel values in [0, 255].
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def erase_random_box(image: torch.Tensor, min_area: float = 0.02,
                     max_area: float = 1 / 3, min_aspect: float = 0.3,
                     max_attempts: int = 10) -> Optional[Tuple[int, int, int, int]]:
    """Fills one random box of a normalised image with standard normal noise.

    The box covers a fraction of the image drawn uniformly from
    ``[min_area, max_area]``, with a log-uniform aspect ratio in
    ``[min_aspect, 1 / min_aspect]`` (random erasing in timm's ``'pixel'``
    mode, one box); placements that do not fit are re-drawn up to
    ``max_attempts`` times.

    Args:
        image (Tensor): (C, H, W), modified in place.
        min_area (float): Least box area / image area. Default: 0.02.
        max_area (float): Largest box area / image area. Default: 1/3.
        min_aspect (float): Least height / width. Default: 0.3.
        max_attempts (int): Draws before giving up. Default: 10.

    Returns:
        tuple[int, int, int, int] | None: ``(top, left, height, width)`` of
        the erased box, or None when no draw fitted.
    """
    _, height, width = image.shape
    log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
    for _ in range(max_attempts):
        area = np.random.uniform(min_area, max_area) * height * width
        aspect = math.exp(np.random.uniform(*log_aspect))
        box_h = int(round(math.sqrt(area * aspect)))
        box_w = int(round(math.sqrt(area / aspect)))
        if 0 < box_h < height and 0 < box_w < width:
            top = int(np.random.randint(0, height - box_h + 1))
            left = int(np.random.randint(0, width - box_w + 1))
            image[:, top:top + box_h, left:left + box_w] = torch.randn(
                image.shape[0], box_h, box_w, dtype=image.dtype, device=image.device)
            return top, left, box_h, box_w
    return None


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


@MODELS.register_module()
class ClassificationDataPreprocessor(BaseDataPreprocessor):
    """Stacks, normalises and (in training) augments a batch of images.

    In order: the uint8 images (C, H, W, all of one size) are stacked and
    moved to the device; BGR becomes RGB (``to_rgb``); ``(x - mean) / std``;
    then, in training only, random erasing per image and Mixup/CutMix per
    batch. Mixing writes each sample's ``gt_score``, a (K, ) vector of class
    probabilities, which the heads use instead of ``gt_label``.

    Args:
        num_classes (int): Number of classes K (for the mixed targets).
        mean (Sequence[float]): Per-channel mean, RGB order.
            Default: ImageNet's.
        std (Sequence[float]): Per-channel std, RGB order. Default:
            ImageNet's.
        to_rgb (bool): Reverse the channel order of the loaded (BGR)
            images. Default: True.
        random_erasing (dict, optional): ``prob`` and the arguments of
            :func:`erase_random_box` (``min_area``, ``max_area``,
            ``min_aspect``), e.g. ``dict(prob=0.25)``; None disables it.
        batch_augments (dict, optional): Arguments of :func:`mix_batch`
            (``mixup_alpha``, ``cutmix_alpha``, ``switch_prob``, ``prob``);
            None disables mixing.
        non_blocking (bool): Non-blocking device transfer. Default: False.
    """

    def __init__(self,
                 num_classes: int,
                 mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD,
                 to_rgb: bool = True,
                 random_erasing: Optional[dict] = None,
                 batch_augments: Optional[dict] = None,
                 non_blocking: bool = False):
        super().__init__(non_blocking)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f'num_classes={num_classes!r} must be a positive int.')
        self.num_classes = num_classes
        self.to_rgb = to_rgb
        self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1), False)
        self.register_buffer('std', torch.tensor(std).view(-1, 1, 1), False)
        self.random_erasing = dict(random_erasing) if random_erasing else None
        self.erase_prob = (self.random_erasing.pop('prob', 0.25)
                           if self.random_erasing else 0.)
        self.batch_augments = dict(batch_augments) if batch_augments else None

    def forward(self, data: dict, training: bool = False) -> dict:
        """``dict(inputs=[(C, H, W) uint8, ...], data_samples=[...])`` -> batch.

        Returns:
            dict: ``inputs`` (B, C, H, W) float and the data samples (with
            ``gt_score`` after mixing).
        """
        data = self.cast_data(data)
        images = data['inputs']
        if isinstance(images, (list, tuple)):
            sizes = {tuple(img.shape) for img in images}
            if len(sizes) != 1:
                raise ValueError(f'images of one batch must have one size (crop them '
                                 f'in the pipeline); got {sorted(sizes)}.')
            images = torch.stack(list(images))
        images = images.float()
        if self.to_rgb and images.shape[1] == 3:
            images = images.flip(1)
        images = (images - self.mean) / self.std
        samples: List[BaseDataElement] = data.get('data_samples')
        if training and self.random_erasing is not None:
            for image in images:
                if np.random.rand() < self.erase_prob:
                    erase_random_box(image, **self.random_erasing)
        if training and self.batch_augments is not None and samples:
            labels = torch.cat([torch.as_tensor(s.gt_label).reshape(-1)[:1]
                                for s in samples]).to(images.device)
            targets = F.one_hot(labels.long(), self.num_classes).float()
            images, targets, _, _ = mix_batch(images, targets, **self.batch_augments)
            for sample, target in zip(samples, targets):
                sample.gt_score = target
        return dict(inputs=images, data_samples=samples)
