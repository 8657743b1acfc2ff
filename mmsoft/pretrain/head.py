"""Class-attention classification head (CaiT / XCiT) over a backbone's tokens."""
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

from ..models.layers import init_transformer_weights
from ..utils import check_divisible, check_positive_int, check_rate
from .class_attention import ClassAttentionBlock
from .metrics import topk_accuracy


@MODELS.register_module()
class ClassAttentionHead(BaseModule):
    """Image classification from the tokens of a backbone's last output.

    The last map of the backbone's outputs, (B, C, h, w), is read as
    ``h * w`` tokens. With ``num_layers >= 1`` (the XCiT / CaiT recipe; XCiT,
    the architecture UFO-ViT builds on, uses 2 layers) a learnable class token
    gathers them through ``num_layers`` :class:`ClassAttentionBlock` s, is
    layer-normalised and fed to a linear classifier. With ``num_layers=0``
    the tokens are averaged instead (global average pooling, then LayerNorm
    and the linear classifier).

    The loss module (``loss``, e.g. :class:`~mmsoft.pretrain.LabelSmoothLoss`)
    compares the logits with the batch's targets: the ``gt_score`` of the
    data samples when present (class-probability vectors written by
    Mixup/CutMix), else their ``gt_label``.

    Args:
        num_classes (int): Number of classes K.
        in_channels (int): Channels C of the backbone's last output.
        num_layers (int): Class-attention layers; 0 means average pooling.
            Default: 2.
        num_heads (int): Heads of the class attention. Default: 8.
        mlp_ratio (float): FFN width ratio of the class-attention layers.
            Default: 4.
        drop_path_rate (float): Stochastic depth of the class-attention
            layers (all layers alike). Default: 0.
        layer_scale_init_value (float): Initial residual scales of the
            class-attention layers. Default: 1e-5.
        loss (dict): Config of the loss module, called as
            ``loss(logits (B, K), targets (B, K) or labels (B, ))``. Default:
            ``dict(type='LabelSmoothLoss', label_smooth_val=0.1,
            mode='original')``.
        topk (Sequence[int]): Training accuracies logged (against hard
            labels, only for batches without soft targets). Default: (1, ).
        init_cfg (dict, optional): Initialization config. Default: None.
    """

    def __init__(self,
                 num_classes: int,
                 in_channels: int,
                 num_layers: int = 2,
                 num_heads: int = 8,
                 mlp_ratio: float = 4.,
                 drop_path_rate: float = 0.,
                 layer_scale_init_value: float = 1e-5,
                 loss: dict = dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                   mode='original'),
                 topk: Sequence[int] = (1, ),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        check_positive_int('num_classes', num_classes)
        check_positive_int('in_channels', in_channels)
        if not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(f'num_layers={num_layers!r} is invalid; expected an '
                             f'int >= 0 (0: average pooling).')
        check_rate('drop_path_rate', drop_path_rate)
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.num_layers = num_layers
        self.loss_module = MODELS.build(loss)
        self.topk = tuple(topk)
        if num_layers > 0:
            check_positive_int('num_heads', num_heads)
            check_divisible('in_channels', [in_channels], 'num_heads', [num_heads])
            self.cls_token = nn.Parameter(torch.zeros(1, 1, in_channels))
            self.layers = nn.ModuleList(
                ClassAttentionBlock(in_channels, num_heads, mlp_ratio,
                                    drop_path=drop_path_rate,
                                    layer_scale_init_value=layer_scale_init_value)
                for _ in range(num_layers))
        self.norm = nn.LayerNorm(in_channels, eps=1e-6)
        self.fc = nn.Linear(in_channels, num_classes)

    def init_weights(self) -> None:
        """Truncated-normal (std 0.02) Linear weights and class token."""
        super().init_weights()
        if self.init_cfg is None:
            self.apply(init_transformer_weights)
            if self.num_layers > 0:
                trunc_normal_(self.cls_token, std=.02)

    def pre_logits(self, feats: Union[torch.Tensor, Sequence[torch.Tensor]]
                   ) -> torch.Tensor:
        """The normalised image embedding.

        Args:
            feats (Tensor | Sequence[Tensor]): Backbone outputs; the last
                one, shape (B, C, h, w) or tokens (B, N, C), is used.

        Returns:
            Tensor: Shape (B, C).
        """
        if isinstance(feats, (tuple, list)):
            feats = feats[-1]
        if feats.dim() == 4:
            feats = feats.flatten(2).transpose(1, 2)  # (B, h * w, C)
        if feats.dim() != 3 or feats.shape[-1] != self.in_channels:
            raise ValueError(f'expected a map (B, {self.in_channels}, h, w) or '
                             f'tokens (B, N, {self.in_channels}); got '
                             f'{tuple(feats.shape)}.')
        if self.num_layers == 0:
            return self.norm(feats.mean(dim=1))
        cls_token = self.cls_token.expand(feats.shape[0], -1, -1)
        for layer in self.layers:
            cls_token = layer(cls_token, feats)
        return self.norm(cls_token[:, 0])

    def forward(self, feats: Union[torch.Tensor, Sequence[torch.Tensor]]
                ) -> torch.Tensor:
        """Class logits, shape (B, K)."""
        return self.fc(self.pre_logits(feats))

    @staticmethod
    def _targets(data_samples: List[BaseDataElement], device) -> torch.Tensor:
        """Soft targets (B, K) if every sample has ``gt_score``, else labels (B, )."""
        if all('gt_score' in sample for sample in data_samples):
            return torch.stack([sample.gt_score for sample in data_samples]).to(device)
        labels = [torch.as_tensor(sample.gt_label).reshape(-1)[:1]
                  for sample in data_samples]
        return torch.cat(labels).to(device)

    def loss(self, feats, data_samples: List[BaseDataElement]
             ) -> Dict[str, torch.Tensor]:
        """The loss module's value for the batch.

        Args:
            feats: Backbone outputs.
            data_samples (list[BaseDataElement]): One per image, with
                ``gt_label`` and, after Mixup/CutMix, ``gt_score``.

        Returns:
            dict[str, Tensor]: ``loss``, and ``accuracy_top{k}`` (percent)
            when the targets are hard labels.
        """
        logits = self(feats)
        targets = self._targets(data_samples, logits.device)
        losses = dict(loss=self.loss_module(logits, targets))
        if targets.dim() == 1:
            with torch.no_grad():
                for k, value in zip(self.topk, topk_accuracy(logits, targets,
                                                             self.topk)):
                    losses[f'accuracy_top{k}'] = value
        return losses

    def predict(self, feats, data_samples: Optional[List[BaseDataElement]] = None
                ) -> List[BaseDataElement]:
        """Class probabilities and the predicted class of every image.

        Args:
            feats: Backbone outputs.
            data_samples (list[BaseDataElement], optional): Updated in place
                (new elements are made when None).

        Returns:
            list[BaseDataElement]: With ``pred_score`` (K, ) and
            ``pred_label`` (1, ).
        """
        scores = self(feats).softmax(dim=-1).detach()
        if data_samples is None:
            data_samples = [BaseDataElement() for _ in range(scores.shape[0])]
        for sample, score in zip(data_samples, scores):
            sample.set_data(dict(pred_score=score,
                                 pred_label=score.argmax(dim=-1, keepdim=True)))
        return data_samples
