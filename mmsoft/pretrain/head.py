"""A classification head of XCiT's class attention over a backbone's tokens."""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from mmpretrain.models.heads import ClsHead
from mmpretrain.registry import MODELS

from ..models.common import init_transformer_weights
from ..models.ufo_vit import ClassAttentionBlock
from ..utils import check_divisible, check_positive_int, check_rate

#: The keys of the blocks of heads saved before they were UFO-ViT's own:
#: mmpretrain's XCiT block (``attn.k`` and ``attn.v`` join as ``kv``).
MMPRETRAIN_BLOCK_KEYS = {'attn.q.': 'q.', 'attn.proj.': 'proj.',
                         'ffn.layers.0.0.': 'mlp.fc1.', 'ffn.layers.1.': 'mlp.fc2.'}


@MODELS.register_module()
class UFOViTClassAttentionHead(ClsHead):
    """Classifies the tokens of the backbone's last output (B, C, h, w) or
    (B, N, C): a class token through ``num_layers`` class-attention blocks
    (XCiT's recipe: 2), or the mean token with ``num_layers=0``; then a
    LayerNorm and a linear layer. Losses and predictions are ``ClsHead``'s."""

    def __init__(self,
                 num_classes: int,
                 in_channels: int,
                 num_layers: int = 2,
                 num_heads: int = 8,
                 mlp_ratio: float = 4.,
                 drop_path_rate: float = 0.,
                 layer_scale_init_value: float = 1e-5,
                 loss: Optional[dict] = None,
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
        super().__init__(loss=loss or dict(type='CrossEntropyLoss', loss_weight=1.0),
                         topk=topk, cal_acc=cal_acc, init_cfg=init_cfg)
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
        """Truncated-normal linear weights and class token, unless ``init_cfg``."""
        super().init_weights()
        if self.init_cfg is None:
            self.apply(init_transformer_weights)
            if self.num_layers > 0:
                trunc_normal_(self.cls_token, std=.02)

    def tokens(self, feats: Union[torch.Tensor, Sequence[torch.Tensor]]
               ) -> torch.Tensor:
        """The tokens (B, N, C) of the last output; a ``ValueError`` for another
    shape."""
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
        """The normalised image embedding (B, C)."""
        tokens = self.tokens(feats)  # (B, N, C)
        if self.num_layers == 0:
            return self.norm(tokens.mean(dim=1))
        cls_token = self.cls_token.expand(tokens.shape[0], -1, -1)
        x = torch.cat((cls_token, tokens), dim=1)  # (B, 1 + N, C)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x[:, 0])

    def forward(self, feats: Union[torch.Tensor, Tuple[torch.Tensor, ...]]
                ) -> torch.Tensor:
        """Class logits (B, K)."""
        return self.fc(self.pre_logits(feats))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Loads heads saved with mmpretrain's block layout too."""
        for i in range(self.num_layers):
            block = f'{prefix}layers.{i}.'
            for old, new in MMPRETRAIN_BLOCK_KEYS.items():
                for param in ('weight', 'bias'):
                    if block + old + param in state_dict:
                        state_dict[block + new + param] = state_dict.pop(
                            block + old + param)
            for param in ('weight', 'bias'):
                keys, values = block + 'attn.k.' + param, block + 'attn.v.' + param
                if keys in state_dict and values in state_dict:
                    state_dict[block + 'kv.' + param] = torch.cat(
                        (state_dict.pop(keys), state_dict.pop(values)))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
