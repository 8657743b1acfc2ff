"""Class-attention classification head (CaiT / XCiT) over a backbone's tokens."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

from ..utils import check_divisible, check_positive_int, check_rate
from ..models.layers import MLP, init_transformer_weights


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                       label_smoothing: float = 0.) -> torch.Tensor:
    """Cross-entropy against class-probability targets, with label smoothing.

    ``targets`` are smoothed as ``t * (1 - eps) + eps / K`` before the loss
    ``-sum(t * log_softmax(logits))``, averaged over the batch. For mixed
    targets ``lam * y1 + (1 - lam) * y2`` (Mixup/CutMix) this equals mixing
    the smoothed one-hot vectors, as timm's ``Mixup(label_smoothing=eps)``
    followed by ``SoftTargetCrossEntropy`` computes.

    Args:
        logits (Tensor): Shape (B, K).
        targets (Tensor): Shape (B, K), rows summing to 1; or (B, ) class
            indices.
        label_smoothing (float): ``eps`` in [0, 1). Default: 0.

    Returns:
        Tensor: Scalar loss.
    """
    num_classes = logits.shape[-1]
    if targets.dim() == 1:
        targets = F.one_hot(targets.long(), num_classes)
    targets = targets.to(logits.dtype)
    if label_smoothing > 0:
        targets = targets * (1 - label_smoothing) + label_smoothing / num_classes
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


class ClassAttention(nn.Module):
    """Softmax attention of the class token over itself and the patch tokens.

    Only the class token issues a query, so cost and memory are linear in the
    number of tokens N (one row of attention weights per head).

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Heads; ``embed_dims`` must be a multiple.
        qkv_bias (bool): Whether the projections have biases. Default: True.
    """

    def __init__(self, embed_dims: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (embed_dims // num_heads)**-0.5
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1 + N, C), class token first -> updated class token (B, 1, C)."""
        batch, tokens, channels = x.shape
        heads, dims = self.num_heads, channels // self.num_heads
        query = self.q(x[:, :1]).reshape(batch, 1, heads, dims).transpose(1, 2)
        keys, values = self.kv(x).reshape(batch, tokens, 2, heads,
                                          dims).permute(2, 0, 3, 1, 4)
        weights = (query * self.scale) @ keys.transpose(-2, -1)  # (B, h, 1, 1+N)
        out = weights.softmax(dim=-1) @ values  # (B, h, 1, d)
        return self.proj(out.transpose(1, 2).reshape(batch, 1, channels))


class ClassAttentionBlock(nn.Module):
    """CaiT's class-attention block with per-channel residual scales.

    ``cls = cls + g1 * CA(LN([cls; x]))``; ``cls = cls + g2 * FFN(LN(cls))``.
    The patch tokens ``x`` are read, never changed.

    Args:
        embed_dims (int): Token width C.
        num_heads (int): Attention heads.
        mlp_ratio (float): FFN hidden width / C. Default: 4.
        qkv_bias (bool): Projection biases. Default: True.
        drop_path (float): Stochastic depth of both branches. Default: 0.
        layer_scale_init_value (float): Initial ``g1``, ``g2``.
            Default: 1e-5.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, drop_path: float = 0.,
                 layer_scale_init_value: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = ClassAttention(embed_dims, num_heads, qkv_bias)
        self.gamma1 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.ffn = MLP(embed_dims, int(embed_dims * mlp_ratio), nn.GELU)
        self.gamma2 = nn.Parameter(torch.full((embed_dims, ), layer_scale_init_value))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, cls_token: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Class token (B, 1, C) and patch tokens (B, N, C) -> (B, 1, C)."""
        joint = self.norm1(torch.cat((cls_token, tokens), dim=1))
        cls_token = cls_token + self.drop_path(self.gamma1 * self.attn(joint))
        return cls_token + self.drop_path(self.gamma2 * self.ffn(self.norm2(cls_token)))


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

    The losses are the cross-entropy against the batch's targets: the
    ``gt_score`` of the data samples when present (class-probability vectors
    written by Mixup/CutMix), else their ``gt_label``; label smoothing is
    applied to either (see :func:`soft_cross_entropy`).

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
        label_smoothing (float): Label smoothing of the loss. Default: 0.1.
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
                 label_smoothing: float = 0.1,
                 topk: Sequence[int] = (1, ),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        check_positive_int('num_classes', num_classes)
        check_positive_int('in_channels', in_channels)
        if not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(f'num_layers={num_layers!r} is invalid; expected an '
                             f'int >= 0 (0: average pooling).')
        check_rate('drop_path_rate', drop_path_rate)
        if not 0 <= label_smoothing < 1:
            raise ValueError(f'label_smoothing={label_smoothing!r} is invalid; '
                             f'expected a value in [0, 1).')
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.num_layers = num_layers
        self.label_smoothing = label_smoothing
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
        """Cross-entropy (with label smoothing) of the batch.

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
        losses = dict(loss=soft_cross_entropy(logits, targets, self.label_smoothing))
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


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor,
                  topk: Sequence[int] = (1, )) -> Tuple[torch.Tensor, ...]:
    """Percentage of rows whose label is among the ``k`` largest logits.

    Args:
        logits (Tensor): Shape (B, K).
        labels (Tensor): Shape (B, ).
        topk (Sequence[int]): Values of k (capped at K).

    Returns:
        tuple[Tensor]: One scalar per k, in [0, 100].
    """
    ranks = logits.topk(min(max(topk), logits.shape[-1]), dim=-1).indices
    hits = ranks == labels.reshape(-1, 1)
    return tuple(hits[:, :min(k, logits.shape[-1])].any(dim=-1).float().mean() * 100
                 for k in topk)
