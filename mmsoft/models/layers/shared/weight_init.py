"""Initialisation shared by the transformer backbones and heads."""
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_


def init_transformer_weights(module: nn.Module) -> None:
    """Truncated-normal (std 0.02) Linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
