"""Batch preparation for classification: normalisation and Mixup/CutMix."""
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseDataPreprocessor
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

from ..utils import check_positive_int
from .batch_augments import mix_batch, mix_options


@MODELS.register_module()
class ClsDataPreprocessor(BaseDataPreprocessor):
    """Stacks, normalises and (in training) mixes a batch of images.

    mmpretrain's ``ClsDataPreprocessor`` (the supported subset of its
    arguments). In order: the uint8 images (C, H, W, all of one size) are
    stacked and moved to the device; BGR becomes RGB (``to_rgb``);
    ``(x - mean) / std``; then, in training only, Mixup/CutMix of the batch
    (:func:`~mmsoft.pretrain.batch_augments.mix_batch`: image ``i`` is mixed
    with image ``B - 1 - i``, as in timm; mmpretrain pairs images by a random
    permutation). Mixing (or ``to_onehot``) writes each sample's
    ``gt_score``, a (K, ) vector of class probabilities, which the heads use
    instead of ``gt_label``.

    Args:
        mean (Sequence[float], optional): Per-channel mean, RGB order when
            ``to_rgb``; None with ``std=None`` skips the normalisation.
            Default: None.
        std (Sequence[float], optional): Per-channel std. Default: None.
        pad_size_divisor (int): Only 1 (the images of a batch must have one
            size). Default: 1.
        pad_value (float): Unused (no padding). Default: 0.
        to_rgb (bool): Reverse the channel order of 3-channel (BGR) images.
            Default: False.
        to_onehot (bool): Write one-hot ``gt_score`` also without mixing.
            Default: False.
        num_classes (int, optional): Number of classes K; needed for
            ``batch_augments`` and ``to_onehot``. Default: None.
        batch_augments (dict, optional): ``dict(augments=[dict(type='Mixup',
            alpha=0.8), dict(type='CutMix', alpha=1.0)], probs=None)``
            (see :func:`~mmsoft.pretrain.batch_augments.mix_options`); None
            disables mixing. Default: None.
        non_blocking (bool): Non-blocking device transfer. Default: False.
    """

    def __init__(self,
                 mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None,
                 pad_size_divisor: int = 1,
                 pad_value: float = 0,
                 to_rgb: bool = False,
                 to_onehot: bool = False,
                 num_classes: Optional[int] = None,
                 batch_augments: Optional[dict] = None,
                 non_blocking: bool = False):
        super().__init__(non_blocking)
        if pad_size_divisor != 1:
            raise ValueError(f'pad_size_divisor={pad_size_divisor!r} is not '
                             f'supported; only 1 (crop the images to one size in '
                             f'the pipeline).')
        if (mean is None) != (std is None):
            raise ValueError(f'mean={mean!r} and std={std!r}: give both or neither.')
        check_positive_int('num_classes', num_classes,
                           allow_none=not (batch_augments or to_onehot))
        self.num_classes = num_classes
        self.to_rgb = to_rgb
        self.to_onehot = to_onehot
        self.normalize = mean is not None
        if self.normalize:
            self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1), False)
            self.register_buffer('std', torch.tensor(std).view(-1, 1, 1), False)
        self.mix_kwargs = mix_options(**batch_augments) if batch_augments else None

    def stack(self, images) -> torch.Tensor:
        """A list of (C, H, W) images of one size, or a batch -> (B, C, H, W) float."""
        if isinstance(images, (list, tuple)):
            sizes = {tuple(img.shape) for img in images}
            if len(sizes) != 1:
                raise ValueError(f'images of one batch must have one size (crop them '
                                 f'in the pipeline); got {sorted(sizes)}.')
            images = torch.stack(list(images))
        return images.float()

    def forward(self, data: dict, training: bool = False) -> dict:
        """``dict(inputs=[(C, H, W) uint8, ...], data_samples=[...])`` -> batch.

        Returns:
            dict: ``inputs`` (B, C, H, W) float and the data samples (with
            ``gt_score`` after mixing or with ``to_onehot``).
        """
        data = self.cast_data(data)
        images = self.stack(data['inputs'])
        if self.to_rgb and images.shape[1] == 3:
            images = images.flip(1)
        if self.normalize:
            images = (images - self.mean) / self.std
        samples: List[BaseDataElement] = data.get('data_samples')
        mix = training and self.mix_kwargs is not None
        if samples and (mix or self.to_onehot):
            labels = torch.cat([torch.as_tensor(s.gt_label).reshape(-1)[:1]
                                for s in samples]).to(images.device)
            targets = F.one_hot(labels.long(), self.num_classes).float()  # (B, K)
            if mix:
                images, targets, _, _ = mix_batch(images, targets, **self.mix_kwargs)
            for sample, target in zip(samples, targets):
                sample.gt_score = target
        return dict(inputs=images, data_samples=samples)
