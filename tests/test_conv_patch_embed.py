"""The convolutional stem's gradients, whatever the images' memory format.

The stem runs channels-last and hands its map on as tokens; the tokens'
gradient reaches its last BatchNorm laid out as tokens. torch's CPU
batch-norm backward gets a gradient laid out unlike its input wrong (seen
with one image: UFO-ViT's stem, which ends with a BatchNorm, at 59b7304 on
torch 2.15, and channels-last on torch 2.1), so the stem lays the gradient
out as its map. Compared with the same stem written with a batch norm of
mean and variance, in float64.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.models.common import GELU, ConvPatchEmbed


def reference_stem(stem: ConvPatchEmbed, x: torch.Tensor) -> torch.Tensor:
    """The stem's layers with batch statistics computed by hand: (B, N, C)."""
    for layer in stem.proj:
        if isinstance(layer, nn.Conv2d):
            x = F.conv2d(x.contiguous(), layer.weight, layer.bias, layer.stride,
                         layer.padding)
        elif isinstance(layer, nn.BatchNorm2d):
            mean = x.mean((0, 2, 3), keepdim=True)
            var = x.var((0, 2, 3), unbiased=False, keepdim=True)
            x = ((x - mean) / torch.sqrt(var + layer.eps) * layer.weight[:, None, None]
                 + layer.bias[:, None, None])
        else:
            x = layer(x.contiguous())
    return x.flatten(2).transpose(1, 2)


def gradients(stem: nn.Module, run, image: torch.Tensor) -> torch.Tensor:
    for param in stem.parameters():
        param.grad = None
    tokens = run(image)
    weights = torch.randn(tokens.shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(2))
    (tokens * weights).sum().backward()
    return torch.cat([param.grad.flatten() for param in stem.parameters()])


@pytest.mark.parametrize('memory_format', [torch.contiguous_format,
                                           torch.channels_last],
                         ids=['nchw', 'channels-last'])
@pytest.mark.parametrize('memory_efficient', [True, False], ids=['fused', 'plain'])
@pytest.mark.parametrize('act_layer, last_act', [(nn.ReLU, True), (GELU, False)],
                         ids=['soft', 'ufo-vit'])
def test_stem_gradients_equal_reference(act_layer, last_act, memory_efficient,
                                        memory_format):
    torch.manual_seed(0)
    stem = ConvPatchEmbed([3, 16, 32, 48], [2, 2, 2], act_layer=act_layer,
                          last_act=last_act).double().train()
    stem.memory_efficient = memory_efficient
    image = torch.randn(1, 3, 40, 56, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))
    expected = gradients(stem, lambda x: reference_stem(stem, x), image)
    got = gradients(stem, lambda x: stem(x)[0],
                    image.contiguous(memory_format=memory_format))
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
