"""Independent functional re-computation of the reference SOFT forward pass.

Everything here operates on a state dict in the key layout of the reference
ImageNet models (``patch_embed1.proj.0.weight``, ``block1.0.att.mha.W_q.weight``,
``block4.0.attn.q.weight``, ``pos_embed1``, ``cls_token``, ``norm.weight``, ...)
and uses plain ``torch`` only, so that it shares no code with ``mmsoft``.

The two attention variants are computed as the reference code does:

* ``'soft'``: ``K1 . NR(A) . (K1^T V) + DWConv(V)``, with the regularised
  Newton-Raphson inverse of ``A + 0.01 I`` whose initial scale is taken per
  matrix (per image and head).
* ``'soft++'`` (the reference's "norm" models):
  ``K1 . (D^-1/2 NR(A) D^-1/2) . (K1^T V) + DWConv(V)``, with the
  unregularised Newton-Raphson iteration whose initial scale and halving test
  are taken over the **whole** (batch, heads, m, m) tensor
  (``scale_scope='tensor'``); ``scale_scope='matrix'`` takes them per matrix
  instead, as ``mmsoft`` does.

The Gaussian kernel is evaluated from explicit differences
``exp(-sum((x - y)^2) / 2)``, the exact form of the reference CUDA kernel.
"""
import math
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

StateDict = Dict[str, torch.Tensor]

BN_EPS = 1e-5
SOFT_LN_EPS = 1e-5  # LayerNorms of stages 1-3 (torch default)
LAST_STAGE_LN_EPS = 1e-6  # stage-4 blocks and the final LayerNorm
REGULARISER = 0.01


def conv_bn_relu(x: torch.Tensor, sd: StateDict, conv: str, bn: str,
                 stride: int) -> torch.Tensor:
    """3x3 convolution (padding 1), inference-mode BatchNorm and ReLU."""
    x = F.conv2d(x, sd[f'{conv}.weight'], sd[f'{conv}.bias'], stride=stride,
                 padding=1)
    x = F.batch_norm(x, sd[f'{bn}.running_mean'], sd[f'{bn}.running_var'],
                     sd[f'{bn}.weight'], sd[f'{bn}.bias'], training=False,
                     eps=BN_EPS)
    return F.relu(x)


def patch_embed(x: torch.Tensor, sd: StateDict, stage: int) -> torch.Tensor:
    """Patch embedding of stage ``stage`` (1-4); returns an NCHW map."""
    prefix = f'patch_embed{stage}.proj'
    if stage == 1:
        x = conv_bn_relu(x, sd, f'{prefix}.0', f'{prefix}.1', 2)
        x = conv_bn_relu(x, sd, f'{prefix}.3', f'{prefix}.4', 1)
        return conv_bn_relu(x, sd, f'{prefix}.6', f'{prefix}.7', 2)
    return conv_bn_relu(x, sd, f'{prefix}.0', f'{prefix}.1', 2)


def resized_pos_embed(pos: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Square grid of position embeddings (1, n*n, C) resized to (1, H*W, C)."""
    channels = pos.shape[-1]
    side = int(pos.shape[1]**0.5)
    grid = pos.transpose(1, 2).reshape(1, channels, side, side)
    grid = F.interpolate(grid, size=(height, width), mode='bilinear',
                         align_corners=False)
    return grid.reshape(1, channels, height * width).transpose(1, 2)


def linear(x: torch.Tensor, sd: StateDict, name: str) -> torch.Tensor:
    return F.linear(x, sd[f'{name}.weight'], sd[f'{name}.bias'])


def layer_norm(x: torch.Tensor, sd: StateDict, name: str, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], sd[f'{name}.weight'], sd[f'{name}.bias'],
                        eps)


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU, written out."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def exact_gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``exp(-||x_i - y_j||^2 / 2)`` from explicit differences; (..., N, M)."""
    diff = x.unsqueeze(-2) - y.unsqueeze(-3)  # (..., N, M, d)
    return torch.exp(-0.5 * diff.pow(2).sum(-1))


def newton_inverse_regularised(mat: torch.Tensor, num_iters: int) -> torch.Tensor:
    """Reference 'soft' inverse: Newton iteration for (A + 0.01 I)^-1.

    The initial scale ``0.9 * 2 / (max row sum of A)^2`` is taken per matrix.
    """
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype)
    row_max = mat.sum(-1).max(-1).values  # (B, h)
    alpha = 0.9 * 2 / row_max**2
    target = mat + REGULARISER * eye
    approx = alpha[..., None, None] * target
    for _ in range(num_iters):
        approx = 2 * approx - approx @ target @ approx
    return approx


def newton_inverse_unregularised(mat: torch.Tensor, num_iters: int,
                                 scale_scope: str = 'tensor') -> torch.Tensor:
    """'soft++' inverse: unregularised Newton iteration.

    ``alpha = 2 / (max row sum)^2``, halved (at most 10 times) while the
    largest column sum of ``|I - A (alpha A)|`` exceeds 1.01; then
    ``V <- 2V - V A V`` from ``V = alpha A``.

    Args:
        mat (Tensor): Kernel matrices, (B, h, m, m).
        num_iters (int): Newton iterations.
        scale_scope (str): Over what the maxima defining ``alpha`` and the
            halving test are taken. ``'tensor'``: the whole (B, h, m, m)
            tensor, one ``alpha`` for all images and heads, as the reference
            code does. ``'matrix'``: each (m, m) matrix on its own.
            Default: ``'tensor'``.
    """
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype)
    if scale_scope == 'tensor':
        def reduce_max(t):  # (B, h, k) -> scalar
            return t.max()
    elif scale_scope == 'matrix':
        def reduce_max(t):  # (B, h, k) -> (B, h, 1, 1)
            return t.max(-1).values[..., None, None]
    else:
        raise ValueError(f'unknown scale_scope {scale_scope!r}')
    alpha = 2 / reduce_max(mat.sum(-1))**2
    halvings = 0
    while halvings < 10:
        too_large = reduce_max((eye - mat @ (alpha * mat)).abs().sum(-2)) > 1.01
        if not bool(too_large.any()):
            break
        alpha = torch.where(too_large, alpha * 0.5, alpha)
        halvings += 1
    approx = alpha * mat
    for _ in range(num_iters):
        approx = 2 * approx - approx @ mat @ approx
    return approx


def softmax_free_attention(x: torch.Tensor, sd: StateDict, prefix: str,
                           num_heads: int, hw: Tuple[int, int], attention: str,
                           num_iters: int, scale_scope: str) -> torch.Tensor:
    """Softmax-free attention of one block (``{prefix}.att.mha``)."""
    height, width = hw
    batch, tokens, channels = x.shape
    head_dims = channels // num_heads
    mha = f'{prefix}.att.mha'

    def heads(t):  # (B, N, C) -> (B, h, N, d)
        return t.reshape(batch, tokens, num_heads, head_dims).permute(0, 2, 1, 3)

    query = heads(linear(x, sd, f'{mha}.W_q')) / head_dims**0.25
    value = heads(linear(x, sd, f'{mha}.W_v'))

    # Bottleneck tokens: one strided conv shared by all heads, then LN + GELU.
    conv_w = sd[f'{mha}.attn.Qlandmark_op.weight']
    ratio = conv_w.shape[-1]
    grid = query.reshape(batch * num_heads, height, width, head_dims)
    grid = F.conv2d(grid.permute(0, 3, 1, 2), conv_w, stride=ratio)
    landmarks = grid.reshape(batch, num_heads, head_dims, -1).transpose(-1, -2)
    landmarks = F.gelu(layer_norm(landmarks, sd, f'{mha}.attn.Qnorm_act.0',
                                  SOFT_LN_EPS))

    kernel_ql = exact_gaussian_kernel(query, landmarks)  # (B, h, N, m)
    kernel_ll = exact_gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
    if attention == 'soft':
        middle = newton_inverse_regularised(kernel_ll, num_iters)
    elif attention == 'soft++':
        inv_sqrt_deg = kernel_ll.sum(-1, keepdim=True).rsqrt()  # (B, h, m, 1)
        middle = newton_inverse_unregularised(kernel_ll, num_iters, scale_scope)
        middle = inv_sqrt_deg * middle * inv_sqrt_deg.transpose(-1, -2)
    else:
        raise ValueError(f'unknown attention {attention!r}')
    out = (kernel_ql @ middle) @ (kernel_ql.transpose(-1, -2) @ value)

    # Depth-wise conv over the heads (one kernel per head, shared by channels).
    local_w = sd[f'{mha}.attn.conv.weight']
    v_grid = value.reshape(batch, num_heads, height, width, head_dims)
    v_grid = v_grid.permute(0, 4, 1, 2, 3).reshape(batch * head_dims, num_heads,
                                                   height, width)
    local = F.conv2d(v_grid, local_w, padding=local_w.shape[-1] // 2,
                     groups=num_heads)
    local = local.reshape(batch, head_dims, num_heads, tokens).permute(0, 2, 3, 1)
    out = out + local

    out = out.permute(0, 2, 1, 3).reshape(batch, tokens, channels)
    return linear(out, sd, f'{mha}.ff')


def softmax_free_block(x: torch.Tensor, sd: StateDict, prefix: str, num_heads: int,
                       hw: Tuple[int, int], attention: str, num_iters: int,
                       scale_scope: str) -> torch.Tensor:
    """Post-norm block of stages 1-3 (``{prefix}.att``)."""
    att = f'{prefix}.att'
    attn = softmax_free_attention(x, sd, prefix, num_heads, hw, attention, num_iters,
                                  scale_scope)
    x = layer_norm(x + attn, sd, f'{att}.norm1', SOFT_LN_EPS)
    ffn = linear(tanh_gelu(linear(x, sd, f'{att}.ff1')), sd, f'{att}.ff2')
    return layer_norm(x + ffn, sd, f'{att}.norm2', SOFT_LN_EPS)


def softmax_block(x: torch.Tensor, sd: StateDict, prefix: str,
                  num_heads: int) -> torch.Tensor:
    """Pre-norm softmax-attention block of stage 4."""
    batch, tokens, channels = x.shape
    head_dims = channels // num_heads
    y = layer_norm(x, sd, f'{prefix}.norm1', LAST_STAGE_LN_EPS)
    query = linear(y, sd, f'{prefix}.attn.q')
    query = query.reshape(batch, tokens, num_heads, head_dims).permute(0, 2, 1, 3)
    key_value = linear(y, sd, f'{prefix}.attn.kv')
    key_value = key_value.reshape(batch, tokens, 2, num_heads, head_dims)
    key, value = key_value.permute(2, 0, 3, 1, 4)
    weights = torch.softmax(query @ key.transpose(-1, -2) * head_dims**-0.5, -1)
    attn = (weights @ value).permute(0, 2, 1, 3).reshape(batch, tokens, channels)
    x = x + linear(attn, sd, f'{prefix}.attn.proj')
    y = layer_norm(x, sd, f'{prefix}.norm2', LAST_STAGE_LN_EPS)
    return x + linear(F.gelu(linear(y, sd, f'{prefix}.mlp.fc1')), sd,
                      f'{prefix}.mlp.fc2')


def block_count(sd: StateDict, stage: int) -> int:
    """Number of blocks of stage ``stage`` (1-4) in the state dict."""
    indices = {int(k.split('.')[1]) for k in sd if k.startswith(f'block{stage}.')}
    return max(indices) + 1


def official_soft_forward(sd: StateDict, images: torch.Tensor,
                          num_heads: Sequence[int], attention: str,
                          num_iters: int = 20,
                          scale_scope: str = 'tensor') -> List[torch.Tensor]:
    """Hidden states of the reference SOFT model, stage by stage.

    Args:
        sd (dict[str, Tensor]): Weights in the reference key layout.
        images (Tensor): Shape (B, 3, H, W).
        num_heads (Sequence[int]): Heads of stages 1-4.
        attention (str): ``'soft'`` or ``'soft++'``.
        num_iters (int): Newton iterations. Default: 20.
        scale_scope (str): ``'soft++'`` only: ``'tensor'`` (the reference
            code) or ``'matrix'``; see :func:`newton_inverse_unregularised`.
            Default: ``'tensor'``.

    Returns:
        list[Tensor]: Four NCHW maps: stages 1-3 after their last block,
        stage 4 after the final LayerNorm without the class token.
    """
    x = images
    batch = images.shape[0]
    outs = []
    for stage in range(1, 5):
        x = patch_embed(x, sd, stage)
        height, width = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)  # (B, N, C)
        pos = sd[f'pos_embed{stage}']
        if stage < 4:
            x = x + resized_pos_embed(pos, height, width)
            for j in range(block_count(sd, stage)):
                x = softmax_free_block(x, sd, f'block{stage}.{j}',
                                       num_heads[stage - 1], (height, width),
                                       attention, num_iters, scale_scope)
        else:
            pos = torch.cat((pos[:, :1], resized_pos_embed(pos[:, 1:], height,
                                                           width)), dim=1)
            x = torch.cat((sd['cls_token'].expand(batch, -1, -1), x), dim=1) + pos
            for j in range(block_count(sd, stage)):
                x = softmax_block(x, sd, f'block4.{j}', num_heads[3])
            x = layer_norm(x, sd, 'norm', LAST_STAGE_LN_EPS)[:, 1:]
        x = x.transpose(1, 2).reshape(batch, -1, height, width)
        outs.append(x)
    return outs


def random_official_state_dict(embed_dims: Sequence[int] = (64, 128, 320, 512),
                               num_heads: Sequence[int] = (2, 4, 10, 16),
                               depths: Sequence[int] = (1, 2, 3, 2),
                               sr_ratios: Sequence[int] = (8, 4, 2),
                               local_kernel_sizes: Sequence[int] = (9, 5, 3),
                               stem_channels: int = 32, mlp_ratio: int = 4,
                               pos_grid: int = 56, num_classes: int = 10,
                               seed: int = 0, empty: bool = False) -> StateDict:
    """Deterministic random weights in the reference key layout.

    Scales keep activations of order one: Linear/conv weights are
    ``randn * gain / sqrt(fan_in)``; the bottleneck LayerNorm has small
    weights so that the bottleneck kernel matrix has sizeable off-diagonal
    entries (the Newton iteration then does real work); BatchNorm running
    statistics are non-trivial.

    Args:
        embed_dims, num_heads, depths: Per-stage widths, heads and blocks.
        sr_ratios, local_kernel_sizes: Stages 1-3 bottleneck strides and
            depth-wise kernel sizes.
        stem_channels (int): Width of the first two stem convolutions.
        mlp_ratio (int): FFN expansion of every stage.
        pos_grid (int): Side of the stage-1 position-embedding grid (56 for
            a model trained at 224x224); stage ``i`` uses ``pos_grid // 2**i``.
        num_classes (int): Classifier outputs (``head.*``).
        seed (int): Seed of the generator.
        empty (bool): Uninitialised tensors of the right shapes instead (for
            tests that only read keys and shapes). Default: False.

    Returns:
        dict[str, Tensor]: float32 tensors (int64 ``num_batches_tracked``).
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        if empty:
            return torch.empty(*shape)
        return torch.randn(*shape, generator=gen) * std

    sd = {}

    def add_linear(name, fan_in, fan_out, gain=1.0):
        sd[f'{name}.weight'] = randn(fan_out, fan_in, std=gain / math.sqrt(fan_in))
        sd[f'{name}.bias'] = randn(fan_out, std=0.1)

    def add_norm(name, dims, scale=1.0):
        sd[f'{name}.weight'] = scale * (1 + randn(dims, std=0.1))
        sd[f'{name}.bias'] = randn(dims, std=0.1)

    def add_conv_bn(conv, bn, cin, cout):
        sd[f'{conv}.weight'] = randn(cout, cin, 3, 3, std=1.5 / math.sqrt(9 * cin))
        sd[f'{conv}.bias'] = randn(cout, std=0.1)
        add_norm(bn, cout)
        sd[f'{bn}.running_mean'] = randn(cout, std=0.2)
        sd[f'{bn}.running_var'] = 0.5 + randn(cout).abs()
        sd[f'{bn}.num_batches_tracked'] = torch.tensor(1000, dtype=torch.int64)

    stem = 'patch_embed1.proj'
    add_conv_bn(f'{stem}.0', f'{stem}.1', 3, stem_channels)
    add_conv_bn(f'{stem}.3', f'{stem}.4', stem_channels, stem_channels)
    add_conv_bn(f'{stem}.6', f'{stem}.7', stem_channels, embed_dims[0])
    for i in range(1, 4):
        add_conv_bn(f'patch_embed{i + 1}.proj.0', f'patch_embed{i + 1}.proj.1',
                    embed_dims[i - 1], embed_dims[i])
    for i in range(4):
        side = pos_grid // 2**i
        sd[f'pos_embed{i + 1}'] = randn(1, side * side + (i == 3), embed_dims[i],
                                        std=0.5)
    sd['cls_token'] = randn(1, 1, embed_dims[3], std=0.5)

    for i in range(3):
        dims, heads = embed_dims[i], num_heads[i]
        head_dims = dims // heads
        ratio, ksize = sr_ratios[i], local_kernel_sizes[i]
        for j in range(depths[i]):
            p = f'block{i + 1}.{j}.att'
            add_linear(f'{p}.mha.W_q', dims, dims, gain=0.7)
            add_linear(f'{p}.mha.W_v', dims, dims)
            sd[f'{p}.mha.attn.Qlandmark_op.weight'] = randn(
                head_dims, head_dims, ratio, ratio,
                std=1.0 / math.sqrt(head_dims * ratio * ratio))
            add_norm(f'{p}.mha.attn.Qnorm_act.0', head_dims, scale=0.3)
            sd[f'{p}.mha.attn.conv.weight'] = randn(heads, 1, ksize, ksize,
                                                    std=1.0 / ksize)
            add_linear(f'{p}.mha.ff', dims, dims)
            add_norm(f'{p}.norm1', dims)
            add_linear(f'{p}.ff1', dims, mlp_ratio * dims)
            add_linear(f'{p}.ff2', mlp_ratio * dims, dims)
            add_norm(f'{p}.norm2', dims)
    dims = embed_dims[3]
    for j in range(depths[3]):
        p = f'block4.{j}'
        add_norm(f'{p}.norm1', dims)
        add_linear(f'{p}.attn.q', dims, dims)
        add_linear(f'{p}.attn.kv', dims, 2 * dims)
        add_linear(f'{p}.attn.proj', dims, dims, gain=0.5)
        add_norm(f'{p}.norm2', dims)
        add_linear(f'{p}.mlp.fc1', dims, mlp_ratio * dims)
        add_linear(f'{p}.mlp.fc2', mlp_ratio * dims, dims, gain=0.5)
    add_norm('norm', dims)
    add_linear('head', dims, num_classes)
    return sd
