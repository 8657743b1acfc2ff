"""Tests of the UFO-ViT backbone and its layers (CPU, small inputs)."""
import copy
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

import mmsoft  # noqa: F401  (registers the backbones)
from mmsoft.openmmlab import UFOViT
from mmsoft.models.ufo_vit import (FeaturePyramidAdapter, LocalPatchInteraction,
                                   UFOAttention, UFOBlock)
from mmsoft.ops.xnorm import qkv_heads, ufo_attention

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
# A small custom architecture for the behavioural tests.
MINI_ARCH = dict(embed_dims=32, depth=4, num_heads=2)


def naive_ufo_reference(attn: UFOAttention, x: torch.Tensor) -> torch.Tensor:
    """Per-head, per-token UFO attention from its definition (float64).

    Entry (n, c) of head j before the output projection is
    ``gamma_q[j] * gamma_kv[j] * cos(q_n, M[:, c])`` with ``M = K^T V``.
    """
    batch, tokens, channels = x.shape
    heads = attn.num_heads
    dims = channels // heads
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    out = torch.empty(batch, tokens, channels, dtype=x.dtype)
    for b in range(batch):
        for j in range(heads):
            cols = slice(j * dims, (j + 1) * dims)
            queries = qkv[b, :, :channels][:, cols]  # (N, d)
            keys = qkv[b, :, channels:2 * channels][:, cols]  # (N, d)
            values = qkv[b, :, 2 * channels:][:, cols]  # (N, d)
            centroids = keys.T @ values  # (d_k, d_v)
            cos = F.cosine_similarity(queries[:, :, None], centroids[None], dim=1)
            out[b, :, cols] = attn.gamma_q[j] * attn.gamma_kv[j] * cos
    return out @ attn.proj.weight.T + attn.proj.bias


def attended(attn: UFOAttention, x: torch.Tensor) -> torch.Tensor:
    """The attention before its output projection: (B, h, N, d)."""
    return ufo_attention(*qkv_heads(attn.qkv(x), attn.num_heads), attn.gamma_q,
                         attn.gamma_kv)


def set_gammas(attn: UFOAttention, gamma_q, gamma_kv) -> None:
    with torch.no_grad():
        attn.gamma_q.copy_(torch.tensor(gamma_q))
        attn.gamma_kv.copy_(torch.tensor(gamma_kv))


def test_ufo_attention_matches_naive_reference():
    torch.manual_seed(0)
    attn = UFOAttention(24, num_heads=3).double()
    set_gammas(attn, [1.5, -0.7, 2.0], [0.3, 1.1, -2.2])
    x = torch.randn(2, 37, 24, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x)
        ref = naive_ufo_reference(attn, x)
    assert out.shape == (2, 37, 24)
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)


def test_ufo_output_bounded_by_gammas():
    torch.manual_seed(1)
    attn = UFOAttention(24, num_heads=3).double()
    set_gammas(attn, [1.5, -0.7, 2.0], [0.3, 1.1, -2.2])
    bound = (attn.gamma_q * attn.gamma_kv).abs().detach()  # 0.45, 0.77, 4.4
    with torch.no_grad():
        pre = attended(attn, 100 * torch.randn(3, 50, 24, dtype=torch.float64))
    assert pre.shape == (3, 3, 50, 8)  # (B, h, N, d)
    assert (pre.abs().amax(dim=(0, 2, 3)) <= bound * (1 + 1e-12)).all()
    # The bound is reached: with one token and Q = K, K^T V = k v^T has
    # columns parallel to k, so every entry is +-gamma_q * gamma_kv.
    with torch.no_grad():
        attn.qkv.weight[:24] = attn.qkv.weight[24:48]
        attn.qkv.bias[:24] = attn.qkv.bias[24:48]
        pre = attended(attn, torch.randn(1, 1, 24, dtype=torch.float64))
    assert torch.allclose(pre.abs(), bound.view(1, 3, 1, 1).expand_as(pre),
                          rtol=1e-12, atol=0)


def test_ufo_attention_is_xnorm_of_queries_times_xnorm_of_context():
    """``XNorm(Q) . XNorm(K^T V)`` written out, ``XNorm(x) = gamma x / |x|``
    over Q's channels and K^T V's d_k axis: a zero query or column stays zero."""
    generator = torch.Generator().manual_seed(0)
    queries, keys, values = (torch.randn(2, 3, 5, 4, generator=generator,
                                         dtype=torch.float64) for _ in range(3))
    queries[0, 0, 2] = 0
    values[1, 2, :, 1] = 0  # a zero column of K^T V
    gamma_q = torch.tensor([2., -3., .5], dtype=torch.float64)
    gamma_kv = torch.tensor([.7, 1.5, -2.], dtype=torch.float64)
    context = keys.transpose(-2, -1) @ values
    expected = ((gamma_q.view(3, 1, 1) * F.normalize(queries, dim=-1, eps=1e-6))
                @ (gamma_kv.view(3, 1, 1) * F.normalize(context, dim=-2, eps=1e-6)))
    out = ufo_attention(queries, keys, values, gamma_q, gamma_kv)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-15)
    assert not out[0, 0, 2].any() and not out[1, 2, :, 1].any()


def test_ufo_attention_runs_on_200k_tokens():
    # A float32 N x N matrix would take 160 GB; K^T V is 8 x 8 per head.
    torch.manual_seed(2)
    attn = UFOAttention(16, num_heads=2)
    x = torch.randn(1, 200_000, 16)
    with torch.no_grad():
        out = attn(x)
        pre = attended(attn, x)
    assert out.shape == (1, 200_000, 16)
    assert torch.isfinite(out).all()
    assert pre.abs().max() <= 1 + 1e-5  # gammas are 1 at initialisation


def test_ufo_attention_float32_under_bf16_autocast():
    torch.manual_seed(3)
    queries, keys, values = (torch.randn(2, 3, 50, 8).bfloat16() for _ in range(3))
    gamma_q, gamma_kv = torch.rand(3) + .5, torch.rand(3) + .5
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = ufo_attention(queries, keys, values, gamma_q, gamma_kv)
    ref = ufo_attention(queries.double(), keys.double(), values.double(),
                        gamma_q.double(), gamma_kv.double())
    assert out.dtype == torch.float32
    # bfloat16 arithmetic (8 significant bits) would be off by ~1e-2.
    assert (out.double() - ref).abs().max() < 1e-5


def test_backbone_norms_in_float32_under_bf16_autocast():
    norm_dtypes = []

    class RecordNorms(torch.overrides.TorchFunctionMode):

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.linalg.vector_norm:
                norm_dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(4)
    model = UFOViT(arch=MINI_ARCH, layer_scale_init_value=1.).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=torch.bfloat16), RecordNorms():
            outs = model(x)
    # Two XNorms per block, four blocks.
    assert norm_dtypes == [torch.float32] * 8
    for out, expected in zip(outs, ref):
        assert torch.isfinite(out).all()
        assert (out.float() - expected).abs().max() < 0.1 * expected.abs().max()


def test_local_patch_interaction_and_block_shapes():
    torch.manual_seed(5)
    lpi = LocalPatchInteraction(16)
    x = torch.randn(2, 5 * 7, 16)
    assert lpi(x, (5, 7)).shape == (2, 35, 16)
    # Depth-wise: a channel's output depends on that channel only.
    x2 = x.clone()
    x2[..., 3] += 1
    lpi.eval()
    diff = (lpi(x2, (5, 7)) - lpi(x, (5, 7))).abs().amax(dim=(0, 1))
    assert diff[3] > 0 and diff[torch.arange(16) != 3].max() == 0
    block = UFOBlock(16, num_heads=4, layer_scale_init_value=1e-5)
    assert block(x, (5, 7)).shape == (2, 35, 16)
    for gamma in (block.gamma1, block.gamma2, block.gamma3):
        assert gamma.shape == (16, ) and (gamma == 1e-5).all()
    with pytest.raises(ValueError, match='kernel_size=4'):
        LocalPatchInteraction(16, kernel_size=4)


def test_feature_pyramid_adapter_shapes():
    adapter = FeaturePyramidAdapter(8)
    feats = [torch.randn(2, 8, 3, 5) for _ in range(4)]
    shapes = [tuple(out.shape) for out in adapter(feats)]
    assert shapes == [(2, 8, 12, 20), (2, 8, 6, 10), (2, 8, 3, 5), (2, 8, 2, 3)]
    partial = FeaturePyramidAdapter(8, out_indices=(1, 3))
    assert sorted(partial.branches.keys()) == ['1', '3']
    # Negative indices count from the end, as in timm.
    assert FeaturePyramidAdapter(8, out_indices=(-1, 1)).out_indices == (1, 3)
    with pytest.raises(ValueError, match='expected one per out_indices'):
        partial(feats)


# Expected map sizes (stride 4, 8, 16, 32) for 33x47 and 97x131 inputs:
# the token grid is ceil(H/16) x ceil(W/16) = 3x3 and 7x9.
EXPECTED_SIZES = {
    (33, 47): [(12, 12), (6, 6), (3, 3), (2, 2)],
    (97, 131): [(28, 36), (14, 18), (7, 9), (4, 5)],
}
# (embed_dims, depth, num_heads) of each arch, as the README's table lists them.
ARCH_SIZES = dict(tiny=(192, 12, 4), small=(304, 16, 8), medium=(416, 16, 8),
                  base=(512, 20, 8))
ARCH_DIMS = {arch: sizes[0] for arch, sizes in ARCH_SIZES.items()}


@pytest.mark.parametrize('arch', ['tiny', 'small', 'medium', 'base'])
def test_output_shapes_per_arch(arch):
    torch.manual_seed(6)
    model = UFOViT(arch=arch).eval()
    dims = ARCH_DIMS[arch]
    for (height, width), sizes in EXPECTED_SIZES.items():
        with torch.no_grad():
            outs = model(torch.randn(1, 3, height, width))
        assert [tuple(out.shape) for out in outs] == [(1, dims, *s) for s in sizes]
        assert all(torch.isfinite(out).all() for out in outs)


def test_out_indices_subset_and_block_readout():
    torch.manual_seed(7)
    model = UFOViT(arch=dict(embed_dims=32, depth=8, num_heads=2),
                   out_indices=(1, 3)).eval()
    assert model.stage_ends == [2, 4, 6, 8]
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        outs = model(x)
        tokens, hw_shape, _ = model.patch_embed(x)
        tokens = tokens + model.pos_embed(2, hw_shape).flatten(2).transpose(1, 2)
        for block in model.blocks:
            tokens = block(tokens, hw_shape)
    assert [tuple(out.shape) for out in outs] == [(2, 32, 8, 10), (2, 32, 2, 3)]
    last = tokens.transpose(1, 2).reshape(2, 32, *hw_shape)  # after block 7
    assert torch.allclose(outs[1], F.max_pool2d(last, 2, ceil_mode=True))


def conv_params(in_channels: int, out_channels: int, kernel_size: int,
                groups: int = 1) -> int:
    """Weights and biases of a square (transposed) convolution."""
    return out_channels * (in_channels // groups) * kernel_size**2 + out_channels


def linear_params(in_features: int, out_features: int) -> int:
    """Weights and biases of a fully connected layer."""
    return in_features * out_features + out_features


def ufo_vit_params(embed_dims: int, depth: int, num_heads: int, mlp_ratio: int = 4,
                   local_kernel_size: int = 3, pos_hidden_dims: int = 32) -> int:
    """Parameters of UFO-ViT from its definition (README, class docstrings).

    Stem: four 3x3 convolutions with biases, 3 -> C/8 -> C/4 -> C/2 -> C, each
    followed by a BatchNorm (weight and bias). Fourier position encoding: a
    1x1 convolution from the 2 x ``pos_hidden_dims`` sinusoidal features to
    C. Each block: three LayerNorms; QKV and output projections; one XNorm
    gamma per head for Q and one for K^T V; local patch interaction (two
    depth-wise convolutions, one BatchNorm); the MLP (C -> ratio*C -> C);
    three per-channel layer scales. Pyramid: stride 4 is two 2x2 transposed
    convolutions with a BatchNorm between, stride 8 one, strides 16 and 32
    have no parameters.
    """
    dims, hidden = embed_dims, embed_dims * mlp_ratio
    widths = [3, dims // 8, dims // 4, dims // 2, dims]
    stem = sum(conv_params(cin, cout, 3) + 2 * cout
               for cin, cout in zip(widths, widths[1:]))
    position = conv_params(2 * pos_hidden_dims, dims, 1)
    attention = (linear_params(dims, 3 * dims) + 2 * num_heads
                 + linear_params(dims, dims))
    patch_interaction = (2 * conv_params(dims, dims, local_kernel_size, groups=dims)
                         + 2 * dims)
    mlp = linear_params(dims, hidden) + linear_params(hidden, dims)
    block = 3 * 2 * dims + attention + patch_interaction + mlp + 3 * dims
    pyramid = 3 * conv_params(dims, dims, 2) + 2 * dims
    return stem + position + depth * block + pyramid


def mask_rcnn_head_params(in_channels: int, channels: int = 256,
                          num_classes: int = 80) -> int:
    """Parameters of mmdet's Mask R-CNN R50-FPN 1x config outside the backbone.

    FPN: per level a 1x1 lateral and a 3x3 output convolution (the fifth
    level is max-pooled). RPN: a 3x3 convolution and 1x1 objectness and box
    convolutions for 3 anchors (sigmoid scores). Box head: two shared FCs of
    1024 on 7x7 RoIs, a (classes + 1)-way classifier and class-specific box
    regression. Mask head: four 3x3 convolutions, a 2x2 transposed
    convolution and a 1x1 per-class mask convolution.
    """
    anchors, fc_dims = 3, 1024
    fpn = 4 * (conv_params(in_channels, channels, 1)
               + conv_params(channels, channels, 3))
    rpn = (conv_params(channels, channels, 3) + conv_params(channels, anchors, 1)
           + conv_params(channels, 4 * anchors, 1))
    bbox = (linear_params(channels * 7 * 7, fc_dims) + linear_params(fc_dims, fc_dims)
            + linear_params(fc_dims, num_classes + 1)
            + linear_params(fc_dims, 4 * num_classes))
    mask = (4 * conv_params(channels, channels, 3) + conv_params(channels, channels, 2)
            + conv_params(channels, num_classes, 1))
    return fpn + rpn + bbox + mask


# Parameters in millions as the README's table shows them: the backbones and
# Mask R-CNN + FPN around them; the paper reports 39.7M (UFO-ViT-S) and 56.4M
# (UFO-ViT-M) for the latter.
BACKBONE_PARAMS_M = dict(tiny=6.08, small=19.62, medium=36.62, base=68.06)
MASK_RCNN_PARAMS_M = dict(small=39.83, medium=56.96)
PAPER_MASK_RCNN_PARAMS = dict(small=39.7e6, medium=56.4e6)


def mask_rcnn_params(arch: str) -> int:
    """Mask R-CNN + FPN total with the UFO-ViT backbone of ``arch``."""
    return (ufo_vit_params(*ARCH_SIZES[arch])
            + mask_rcnn_head_params(ARCH_DIMS[arch]))


@pytest.mark.parametrize('arch', ['tiny', 'small', 'medium', 'base'])
def test_parameter_counts(arch):
    model = UFOViT(arch=arch)
    assert (model.embed_dims, model.depth, model.blocks[0].attn.num_heads) == \
        ARCH_SIZES[arch]
    expected = ufo_vit_params(*ARCH_SIZES[arch])
    assert sum(p.numel() for p in model.parameters()) == expected
    assert round(expected / 1e6, 2) == BACKBONE_PARAMS_M[arch]


@pytest.mark.parametrize('arch', ['small', 'medium'])
def test_mask_rcnn_totals_match_paper_and_readme(arch):
    total = mask_rcnn_params(arch)
    assert round(total / 1e6, 2) == MASK_RCNN_PARAMS_M[arch]
    paper = PAPER_MASK_RCNN_PARAMS[arch]
    assert abs(total - paper) / paper < 0.011


def test_docs_table_shows_each_arch():
    with open(osp.join(REPO, 'docs', 'backbones.md'), encoding='utf-8') as f:
        readme = f.read()
    for arch, (dims, depth, heads) in ARCH_SIZES.items():
        detector = [f'{MASK_RCNN_PARAMS_M[arch]:.2f}M',
                    f'{PAPER_MASK_RCNN_PARAMS[arch] / 1e6:.1f}M'] \
            if arch in MASK_RCNN_PARAMS_M else ['–', '–']
        cells = [arch, dims, depth, heads, f'{BACKBONE_PARAMS_M[arch]:.2f}M', *detector]
        row = '| ' + ' | '.join(map(str, cells)) + ' |'
        assert row in readme, f'docs/backbones.md lacks the UFO-ViT table row {row!r}'


@pytest.mark.parametrize('kwargs, message', [
    (dict(arch='large'), r"arch='large' is not supported"),
    (dict(arch=dict(embed_dims=48, depth=4, num_heads=5)),
     r"arch\['embed_dims'\]\[0\]=48 is not divisible by arch\['num_heads'\]"),
    (dict(arch=dict(embed_dims=36, depth=4, num_heads=2)),
     r"arch\['embed_dims'\]=36 is invalid; expected a multiple of 8"),
    (dict(arch=dict(embed_dims=32, depth=3, num_heads=2)),
     r"arch\['depth'\]=3 is invalid; expected at least 4"),
    (dict(arch=dict(embed_dims=32, depth=4, num_heads=2, mlp_ratio=0)),
     r"arch\['mlp_ratio'\]=0 is invalid"),
    (dict(arch=dict(embed_dims=32, depth=4)), r"lacks the keys \['num_heads'\]"),
    (dict(out_indices=(0, 4)), r'out_indices=\(0, 4\) is invalid'),
    (dict(out_indices=(-5, )), r'out_indices=\(-5,\) is invalid; expected distinct '
                               r'integers in \[-4, 3\]'),
    (dict(out_indices=(3, -1)), r'out_indices=\(3, -1\) names an output twice'),
    (dict(frozen_stages=5), r'frozen_stages=5 is out of range'),
    (dict(drop_path_rate=1.5), r'drop_path_rate=1.5 is invalid'),
    (dict(layer_scale_init_value=0), r'layer_scale_init_value=0 is invalid'),
])
def test_bad_arguments_raise(kwargs, message):
    kwargs.setdefault('arch', MINI_ARCH)
    with pytest.raises(ValueError, match=message):
        UFOViT(**kwargs)


def test_bad_inputs_raise():
    model = UFOViT(arch=MINI_ARCH)
    with pytest.raises(ValueError, match='has 1 channels .* in_channels=3'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='31x64 is too small.* at least 32'):
        model(torch.randn(1, 3, 31, 64))
    with pytest.raises(ValueError, match='4-D tensor'):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match=r'embed_dims\[0\]=30 is not divisible'):
        UFOAttention(30, num_heads=4)


def test_frozen_stages_freeze_parameters():
    arch = dict(embed_dims=32, depth=8, num_heads=2)
    model = UFOViT(arch=arch, frozen_stages=2)
    model.init_weights()
    model.train()
    frozen = [model.patch_embed, model.pos_embed, *model.blocks[:4],
              model.pyramid.branches['0'], model.pyramid.branches['1']]
    trainable = [*model.blocks[4:], model.pyramid.branches['2']]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for m in trainable for p in m.parameters())
    assert not model.patch_embed.proj[1].training  # stem BN in eval mode
    assert not model.pyramid.branches['0'][1].training
    assert model.blocks[4].lpi.bn.training
    num_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert num_frozen == sum(p.numel() for m in frozen for p in m.parameters())
    sum(out.sum() for out in model(torch.randn(2, 3, 64, 64))).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())
    assert model.blocks[4].attn.qkv.weight.grad.abs().sum() > 0
    nothing = UFOViT(arch=arch, frozen_stages=-1).train()
    assert all(p.requires_grad for p in nothing.parameters())
    everything = UFOViT(arch=arch, frozen_stages=4).train()
    assert not any(p.requires_grad for p in everything.parameters())


def test_norm_eval_and_with_cp():
    torch.manual_seed(8)
    model = UFOViT(arch=MINI_ARCH, norm_eval=True, drop_path_rate=0.,
                   layer_scale_init_value=1.)
    model.train()
    assert not model.blocks[0].lpi.bn.training and model.blocks[0].training
    checkpointed = copy.deepcopy(model)
    checkpointed.with_cp = True
    x = torch.randn(2, 3, 48, 64)
    grads = []
    for net in (model, checkpointed):
        net.zero_grad()
        sum((out**2).mean() for out in net(x)).backward()
        grads.append(net.blocks[1].attn.qkv.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def _batch_norms(model):
    return [m for m in model.modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


@pytest.mark.parametrize('memory_efficient', [True, False])
def test_with_cp_updates_running_statistics_once(memory_efficient):
    """with_cp and norm_eval=False: every BatchNorm's running statistics and
    batch count after one step equal those without checkpoints (the block's
    rerun in backward updates none of them)."""
    torch.manual_seed(8)
    plain = UFOViT(arch=MINI_ARCH, norm_eval=False, drop_path_rate=0.,
                   memory_efficient=memory_efficient).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.with_cp = True
    x = torch.randn(2, 3, 48, 64)
    for net in (plain, checkpointed):
        sum((out**2).mean() for out in net(x, [(48, 64), (40, 48)])).backward()
    lpi_norms = {id(block.lpi.bn) for block in plain.blocks}
    checked = 0
    for norm, norm_cp in zip(_batch_norms(plain), _batch_norms(checkpointed)):
        assert int(norm_cp.num_batches_tracked) == int(norm.num_batches_tracked) == 1
        torch.testing.assert_close(norm_cp.running_mean, norm.running_mean)
        torch.testing.assert_close(norm_cp.running_var, norm.running_var)
        checked += id(norm) in lpi_norms
    assert checked == len(plain.blocks)
    for param, param_cp in zip(plain.parameters(), checkpointed.parameters()):
        if param.grad is not None:
            torch.testing.assert_close(param_cp.grad, param.grad, rtol=1e-4, atol=1e-6)


def test_sync_batch_norm_is_never_recomputed_as_a_plain_one():
    """mmengine's sync_bn='torch' converts every BatchNorm into a
    SyncBatchNorm (torch's convert_sync_batchnorm): the local patch
    interactions then keep autograd's path, the stem and pyramid fuse none of
    their norms, and with_cp's rerun runs each SyncBatchNorm module itself
    (without a process group it normalises as a BatchNorm, so the gradients
    equal the unconverted model's)."""
    from mmsoft.models.common import recomputes_locally
    torch.manual_seed(8)
    model = UFOViT(arch=MINI_ARCH, norm_eval=False, drop_path_rate=0.).train()
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert converted.patch_embed.proj[1].__class__ is torch.nn.SyncBatchNorm
    assert recomputes_locally(model.blocks[0].lpi.bn)
    assert not any(recomputes_locally(norm) for norm in _batch_norms(converted))
    converted.with_cp = True
    x = torch.randn(2, 3, 48, 64)
    for net in (model, converted):
        sum((out**2).mean() for out in net(x)).backward()
    for norm, synced in zip(_batch_norms(model), _batch_norms(converted)):
        assert isinstance(synced, torch.nn.SyncBatchNorm)
        assert int(synced.num_batches_tracked) == 1
        torch.testing.assert_close(synced.running_mean, norm.running_mean)
    for param, synced in zip(model.parameters(), converted.parameters()):
        torch.testing.assert_close(synced.grad, param.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.mmcv_ops  # imports mmdet.models/mmseg.models
def test_registered_in_root_and_downstream_registries():
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.registry import MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    for registry in (MODELS, DET_MODELS, SEG_MODELS):
        model = registry.build(dict(type='UFOViT', arch=MINI_ARCH))
        assert isinstance(model, UFOViT)


MASK_RCNN_CONFIG = """
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)
model = dict(
    backbone=dict(_delete_=True, type='UFOViT', arch='{arch}', drop_path_rate=0.1),
    neck=dict(in_channels=[{dims}] * 4))
"""


def mask_rcnn_config(arch: str):
    """mmdet's Mask R-CNN R50-FPN 1x config with UFO-ViT in place of ResNet."""
    from mmengine.config import Config
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    return Config.fromstring(
        MASK_RCNN_CONFIG.format(arch=arch, dims=ARCH_DIMS[arch]), '.py')


def backbone_grads(backbone: UFOViT):
    """Gradient magnitudes of the first stem conv and the last block's QKV."""
    return (backbone.patch_embed.proj[0].weight.grad.abs().sum().item(),
            backbone.blocks[-1].attn.qkv.weight.grad.abs().sum().item())


@pytest.mark.slow
@pytest.mark.parametrize('arch', ['small', 'medium'])
@pytest.mark.mmcv_ops  # builds Mask R-CNN
def test_mask_rcnn_parameter_totals(arch):
    from mmsoft.apis import build_in_scope
    model = build_in_scope('mmdet', mask_rcnn_config(arch).model)
    total = sum(p.numel() for p in model.parameters())
    assert total == mask_rcnn_params(arch)
    paper = PAPER_MASK_RCNN_PARAMS[arch]
    assert abs(total - paper) / paper < 0.011


@pytest.mark.slow
@pytest.mark.mmcv_ops  # trains Mask R-CNN
def test_mask_rcnn_train_step_and_predict():
    from mmengine.registry import MODELS
    from mmengine.registry import DefaultScope
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(9)
    cfg = mask_rcnn_config('tiny')
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
        model.init_weights()
        packed = demo_mm_inputs(2, [(3, 64, 64)] * 2, num_items=[3, 2],
                                num_classes=80, with_mask=True)
        model.train()
        data = model.data_preprocessor(packed, training=True)
        loss, log_vars = model.parse_losses(model(**data, mode='loss'))
        loss.backward()
        for name in ('loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'):
            assert name in log_vars and torch.isfinite(torch.tensor(log_vars[name]))
        assert torch.isfinite(loss)
        stem_grad, block_grad = backbone_grads(model.backbone)
        assert stem_grad > 0 and block_grad > 0
        before = model.backbone.blocks[-1].attn.qkv.weight.detach().clone()
        torch.optim.SGD(model.parameters(), lr=0.01).step()
        assert not torch.equal(before, model.backbone.blocks[-1].attn.qkv.weight)
        model.eval()
        with torch.no_grad():
            results = model.test_step(packed)
    assert len(results) == 2
    for result in results:
        pred = result.pred_instances
        assert pred.bboxes.shape[-1] == 4 and torch.isfinite(pred.bboxes).all()
        assert len(pred.scores) == len(pred.labels) == len(pred.masks)


# UperNet with BN instead of SyncBN, narrower heads for a fast CPU test.
UPERNET_CONFIG = """
_base_ = 'mmseg::_base_/models/upernet_r50.py'
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(64, 64)),
    backbone=dict(_delete_=True, type='UFOViT', arch='tiny', drop_path_rate=0.1),
    decode_head=dict(in_channels=[192] * 4, channels=128, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=192, channels=64, norm_cfg=norm_cfg))
"""


@pytest.mark.slow
@pytest.mark.mmcv_ops  # trains UperNet
def test_upernet_train_step_and_predict():
    from mmengine.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = Config.fromstring(UPERNET_CONFIG, '.py')
    torch.manual_seed(10)
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 19, (1, 64, 64)))
        samples.append(sample)
    batch = dict(inputs=[torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
                         for _ in range(2)], data_samples=samples)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model)
        model.init_weights()
        model.train()
        data = model.data_preprocessor(batch, training=True)
        loss, log_vars = model.parse_losses(model(**data, mode='loss'))
        loss.backward()
        assert torch.isfinite(loss)
        assert {'decode.loss_ce', 'aux.loss_ce'} <= set(log_vars)
        stem_grad, block_grad = backbone_grads(model.backbone)
        assert stem_grad > 0 and block_grad > 0
        torch.optim.SGD(model.parameters(), lr=0.01).step()
        model.eval()
        with torch.no_grad():
            results = model.test_step(batch)
    assert len(results) == 2
    for result in results:
        assert result.pred_sem_seg.data.shape == (1, 64, 64)
        assert result.seg_logits.data.shape == (19, 64, 64)
        assert torch.isfinite(result.seg_logits.data).all()


# --------------------------------------------------------------------------
# init_cfg=dict(type='Pretrained'): strict loading
# --------------------------------------------------------------------------
def _classifier_backbone_state() -> dict:
    """A backbone checkpoint as a classifier gives it: random tensors of
    MINI_ARCH without the stride-4/8 resampling branches."""
    gen = torch.Generator().manual_seed(11)
    return {k: torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in UFOViT(arch=MINI_ARCH).state_dict().items()
            if not k.startswith(('pyramid.branches.0.', 'pyramid.branches.1.'))}


def _pretrained(path, **init_cfg) -> UFOViT:
    return UFOViT(arch=MINI_ARCH, init_cfg=dict(type='Pretrained',
                                                checkpoint=str(path), **init_cfg))


@pytest.mark.parametrize('layout', ['bare', 'state_dict', 'backbone.', 'module.'])
def test_pretrained_backbone_checkpoint_loads(layout, tmp_path):
    weights = _classifier_backbone_state()
    if layout == 'bare':
        saved = weights
    else:
        prefix = layout if layout.endswith('.') else ''
        saved = {'state_dict': {prefix + k: v for k, v in weights.items()}}
    torch.save(saved, tmp_path / 'backbone.pth')
    model = _pretrained(tmp_path / 'backbone.pth')
    initial = copy.deepcopy(model.pyramid.branches['0'].state_dict())
    model.init_weights()
    state = model.state_dict()
    for key, value in weights.items():
        assert torch.equal(state[key], value), key
    # The untrained output branches keep their initial values.
    for key, value in model.pyramid.branches['0'].state_dict().items():
        assert torch.equal(value, initial[key]), key


def test_pretrained_detector_checkpoint_needs_its_prefix(tmp_path):
    weights = _classifier_backbone_state()
    detector = {f'backbone.{k}': v for k, v in weights.items()}
    detector['neck.conv.weight'] = torch.zeros(4, 32, 1, 1)
    path = tmp_path / 'mask-rcnn.pth'
    torch.save({'state_dict': detector, 'meta': dict(epoch=12)}, path)
    model = _pretrained(path, prefix='backbone.')
    model.init_weights()
    assert torch.equal(model.blocks[3].gamma1, weights['blocks.3.gamma1'])
    with pytest.raises(ValueError, match=r'does not fit the UFOViT backbone: '
                       r'unexpected keys: neck\.conv\.weight\.'):
        _pretrained(path).init_weights()


def test_pretrained_mismatch_lists_the_keys(tmp_path):
    weights = _classifier_backbone_state()
    del weights['blocks.2.mlp.fc2.bias']
    weights['blocks.1.extra.weight'] = torch.zeros(3)
    weights['blocks.0.norm1.weight'] = torch.zeros(48)
    torch.save(weights, tmp_path / 'bad.pth')
    with pytest.raises(ValueError) as err:
        _pretrained(tmp_path / 'bad.pth').init_weights()
    message = str(err.value)
    assert f'checkpoint {tmp_path / "bad.pth"} does not fit the UFOViT backbone' \
        in message
    assert 'missing keys: blocks.2.mlp.fc2.bias;' in message
    assert 'unexpected keys: blocks.1.extra.weight;' in message
    assert 'blocks.0.norm1.weight: (48,) (expected (32,))' in message


def test_pretrained_frozen_stages_apply_after_loading(tmp_path):
    torch.save(_classifier_backbone_state(), tmp_path / 'backbone.pth')
    model = _pretrained(tmp_path / 'backbone.pth', map_location='cpu')
    model.frozen_stages = 1
    model.init_weights()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not model.blocks[0].gamma1.requires_grad
    assert model.blocks[1].gamma1.requires_grad
