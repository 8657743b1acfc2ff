"""Class-attention classification head (XCiT) over a backbone's tokens."""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from mmpretrain.models.heads import ClsHead
from mmpretrain.registry import MODELS

from ..models.common import init_transformer_weights
from ..utils import check_divisible, check_positive_int, check_rate
from .class_attention import ClassAttentionBlock


@MODELS.register_module()
class UFOViTClassAttentionHead(ClsHead):
    """Image classification from the tokens of a backbone's last output.

    The last map of the backbone's outputs, (B, C, h, w), is read as
    ``h * w`` tokens (tokens (B, N, C) are taken as they are). With
    ``num_layers >= 1`` (XCiT's recipe, 2 layers) a learnable class token is
    put before them and the sequence goes through ``num_layers``
    :class:`ClassAttentionBlock` s, as in XCiT's class-attention stage; the
    class token is layer-normalised and fed to a linear classifier. With
    ``num_layers=0`` the tokens are averaged instead (then LayerNorm and the
    linear classifier).

    Losses, training accuracy and predictions are mmpretrain's
    :class:`~mmpretrain.models.heads.ClsHead` ones: the loss module compares
    the logits with the ``gt_score`` of the data samples (class-probability
    vectors written by Mixup/CutMix) when present, else with their
    ``gt_label``; :meth:`predict` sets ``pred_score`` (softmax) and
    ``pred_label``.

    Args:
        num_classes (int): Number of classes K.
        in_channels (int): Channels C of the backbone's last output.
        num_layers (int): Class-attention layers; 0 means average pooling.
            Default: 2.
        num_heads (int): Heads of the class attention; must divide
            ``in_channels``. Default: 8.
        mlp_ratio (float): MLP width ratio of the class-attention layers.
            Default: 4.
        drop_path_rate (float): Stochastic depth of the class-attention
            layers (all layers alike), in [0, 1). Default: 0.
        layer_scale_init_value (float): Initial residual scales of the
            class-attention layers. Default: 1e-5.
        loss (dict): Config of the loss module (mmpretrain's registry).
            Default: ``dict(type='CrossEntropyLoss', loss_weight=1.0)``.
        topk (int | Sequence[int]): Training accuracies computed when
            ``cal_acc``. Default: (1, ).
        cal_acc (bool): Log training accuracies (only for hard labels, i.e.
            without Mixup/CutMix). Default: False.
        init_cfg (dict, optional): Initialization config; None gives
            truncated-normal (std 0.02) Linear weights and class token.
            Default: None.
    """

    def __init__(self,
                 num_classes: int,
                 in_channels: int,
                 num_layers: int = 2,
                 num_heads: int = 8,
                 mlp_ratio: float = 4.,
                 drop_path_rate: float = 0.,
                 layer_scale_init_value: float = 1e-5,
                 loss: dict = dict(type='CrossEntropyLoss', loss_weight=1.0),
                 topk: Union[int, Sequence[int]] = (1, ),
                 cal_acc: bool = False,
                 init_cfg: Optional[dict] = None):
        check_positive_int('num_classes', num_classes)
        check_positive_int('in_channels', in_channels)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or \
                num_layers < 0:
            raise ValueError(f'num_layers={num_layers!r} is invalid; expected an '
                             f'int >= 0 (0: average pooling).')
        check_rate('drop_path_rate', drop_path_rate)
        if num_layers > 0:
            check_positive_int('num_heads', num_heads)
            check_divisible('in_channels', [in_channels], 'num_heads', [num_heads])
        super().__init__(loss=loss, topk=topk, cal_acc=cal_acc, init_cfg=init_cfg)
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.num_layers = num_layers
        if num_layers > 0:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, in_channels))
            self.layers = nn.ModuleList(
                ClassAttentionBlock(in_channels, num_heads, mlp_ratio,
                                    drop_path=drop_path_rate,
                                    layer_scale_init_value=layer_scale_init_value)
                for _ in range(num_layers))
        self.norm = nn.LayerNorm(in_channels, eps=1e-6)
        self.fc = nn.Linear(in_channels, num_classes)

    def init_weights(self) -> None:
        """Truncated-normal (std 0.02) Linear weights and class token, zero
        biases, unit LayerNorms; ``init_cfg`` when given."""
        super().init_weights()
        if self.init_cfg is None:
            self.apply(init_transformer_weights)
            if self.num_layers > 0:
                trunc_normal_(self.cls_token, std=.02)

    def tokens(self, feats: Union[torch.Tensor, Sequence[torch.Tensor]]
               ) -> torch.Tensor:
        """The tokens (B, N, C) of the backbone's last output.

        Raises:
            ValueError: The output is neither (B, C, h, w) nor (B, N, C) with
                ``C = in_channels``.
        """
        if isinstance(feats, (tuple, list)):
            feats = feats[-1]
        if feats.dim() == 4:
            feats = feats.flatten(2).transpose(1, 2)  # (B, h * w, C)
        if feats.dim() != 3 or feats.shape[-1] != self.in_channels:
            raise ValueError(f'expected a map (B, {self.in_channels}, h, w) or '
                             f'tokens (B, N, {self.in_channels}); got '
                             f'{tuple(feats.shape)}.')
        return feats

    def pre_logits(self, feats: Union[torch.Tensor, Tuple[torch.Tensor, ...]]
                   ) -> torch.Tensor:
        """The normalised image embedding.

        Args:
            feats (Tensor | tuple[Tensor]): Backbone outputs; the last one,
                shape (B, C, h, w) or tokens (B, N, C), is used.

        Returns:
            Tensor: Shape (B, C).
        """
        tokens = self.tokens(feats)  # (B, N, C)
        if self.num_layers == 0:
            return self.norm(tokens.mean(dim=1))
        cls_token = self.cls_token.expand(tokens.shape[0], -1, -1)
        x = torch.cat((cls_token, tokens), dim=1)  # (B, 1 + N, C)
        for layer in self.layers:
            x = layer.forward_sequence(x)
        return self.norm(x[:, 0])

    def forward(self, feats: Union[torch.Tensor, Tuple[torch.Tensor, ...]]
                ) -> torch.Tensor:
        """Class logits, shape (B, K)."""
        return self.fc(self.pre_logits(feats))
