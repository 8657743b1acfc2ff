"""mmsoft's UFO-ViT layers against timm's XCiT, the code UFO-ViT builds on.

UFO-ViT (Song 2021) keeps XCiT's convolutional stem, Fourier position
encoding, local patch interaction and class attention, and replaces XCiT's
cross-covariance attention (XCA). Each test below builds timm 1.0.31's own
module (``timm.models.xcit``) and mmsoft's, re-initialises timm's with random
non-trivial values (norm weights, running statistics and residual scales
included), copies them across through an explicit key mapping, and compares
outputs (and input gradients) in float64, eval mode, within 1e-5.

Where mmsoft departs from XCiT on purpose, a test shows the difference
concretely:

* the attention: ``XNorm(Q) . XNorm(K^T V)`` instead of XCA's softmax over
  the d x d cross-covariance; same ``qkv``/``proj`` weights, different
  outputs, each equal to its formula written here;
* padded batches (``valid_shapes`` / ``key_mask``): mmsoft's features in an
  image's valid region equal those of the image alone, timm's do not;
* the stem's convolution biases (XCiT's have none, redundant before BN);
* the stride-32 max pool rounds odd grids up (XCiT's detection code: down).

Also checked: UFOBlock is XCiT's ``XCABlock`` and UFOViT's stride-16 output
is timm's ``Xcit`` once UFO attention is swapped in (UFO-ViT's claim that it
changes only the attention); mmsoft's class-attention block follows XCiT's
(not CaiT's, which differs, also shown).

timm imports torchvision, hence the ``torchvision`` marker.
"""
import math
from functools import partial
from typing import Dict, Iterable, Tuple, Union

import pytest
import torch
import torch.nn as nn

xcit = pytest.importorskip('timm.models.xcit')
cait = pytest.importorskip('timm.models.cait')

from mmsoft.models.common import ConvPatchEmbed, regions_on_grid
from mmsoft.models.ufo_vit import (FourierPositionEncoding, LocalPatchInteraction,
                                   UFOAttention, UFOBlock)
from mmsoft.ops.xnorm import ufo_attention

pytestmark = pytest.mark.torchvision

ATOL = 1e-5
#: The LayerNorm timm's ``Xcit`` and ``Cait`` models give their blocks (the
#: blocks' own default, ``nn.LayerNorm``, has eps 1e-5); mmsoft's use 1e-6.
XCIT_NORM = partial(nn.LayerNorm, eps=1e-6)
#: A mapping rule: a source key, a tuple of source keys concatenated along
#: dim 0, or a tensor for an entry the source does not have.
Rule = Union[str, Tuple[str, ...], torch.Tensor]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
@pytest.fixture(autouse=True, scope='module')
def one_thread():
    """One intra-op thread: the tensors are tiny, and on busy cores a
    second thread's synchronisation costs far more than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomise_(module: nn.Module, seed: int) -> nn.Module:
    """Random, non-trivial values for every floating parameter and buffer.

    Weights (dim >= 2) get ``randn / sqrt(fan_in)`` so activations stay O(1);
    vectors (biases, norm weights, LayerScales, temperatures) ``randn / 2``
    (``+ 1`` for norm weights and scales, so none is near zero); BatchNorm
    running variances ``U(0.5, 1.5)`` and means ``randn / 2``. The module is
    converted to float64 and put in eval mode.
    """
    gen = torch.Generator().manual_seed(seed)
    module.double().eval()
    with torch.no_grad():
        entries = list(module.named_parameters()) + list(module.named_buffers())
        for name, tensor in entries:
            if not tensor.is_floating_point():
                continue
            leaf = name.rsplit('.', 1)[-1]
            shape = tensor.shape
            if leaf == 'running_var':
                value = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5
            elif tensor.dim() >= 2 and leaf not in ('temperature', ):
                fan_in = tensor[0].numel()
                value = torch.randn(shape, generator=gen, dtype=torch.float64)
                value /= math.sqrt(fan_in)
            else:
                value = torch.randn(shape, generator=gen, dtype=torch.float64) / 2
                if leaf.startswith('gamma') or leaf == 'temperature' or (
                        leaf == 'weight' and tensor.dim() == 1):
                    value = value + 1
            tensor.copy_(value)
    return module


def load_mapped(dst: nn.Module, src: nn.Module, mapping: Dict[str, Rule],
                unmapped_src: Iterable[str] = ()) -> None:
    """Loads ``dst`` from ``src``'s state through ``mapping`` (dst key -> rule).

    Strict both ways: every entry of ``dst`` has a rule, and every entry of
    ``src`` is used by one, except those listed in ``unmapped_src`` (which
    have no counterpart in ``dst``).
    """
    src_state, dst_state = src.state_dict(), dst.state_dict()
    assert set(mapping) == set(dst_state), (
        f'unmapped mmsoft keys: {sorted(set(dst_state) - set(mapping))}; '
        f'unknown: {sorted(set(mapping) - set(dst_state))}')
    used, new_state = set(unmapped_src), {}
    for key, rule in mapping.items():
        if isinstance(rule, torch.Tensor):
            value = rule
        else:
            keys = (rule, ) if isinstance(rule, str) else rule
            used.update(keys)
            value = src_state[keys[0]] if len(keys) == 1 else torch.cat(
                [src_state[k] for k in keys])
        assert value.shape == dst_state[key].shape, (key, value.shape)
        new_state[key] = value.to(dst_state[key].dtype)
    left = sorted(set(src_state) - used)
    assert not left, f'timm keys not copied: {left}'
    dst.load_state_dict(new_state, strict=True)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max absolute difference of two tensors of the same shape."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
    """Asserts ``max|a - b| <= ATOL`` and returns it."""
    diff = max_diff(a, b)
    print(f'{what}: max abs diff {diff:.3g}')
    assert diff <= ATOL, f'{what}: max abs diff {diff:.3g} > {ATOL}'
    return diff


def assert_differs(a: torch.Tensor, b: torch.Tensor, what: str,
                   at_least: float = 1e-3) -> float:
    """Asserts ``max|a - b| >= at_least`` and returns it."""
    diff = max_diff(a, b)
    print(f'{what}: max abs diff {diff:.3g} (differs on purpose)')
    assert diff >= at_least, f'{what}: expected a difference, got {diff:.3g}'
    return diff


def randn(*shape: int, seed: int, requires_grad: bool = False) -> torch.Tensor:
    """A float64 standard-normal tensor from its own generator."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64,
                       requires_grad=requires_grad)


def input_grad(fn, x: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``fn(x)`` and the gradient of ``<fn(x), g>`` w.r.t. ``x``, g random."""
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    grad_out = randn(*out.shape, seed=seed)
    (grad, ) = torch.autograd.grad(out, x, grad_out)
    return out.detach(), grad


def region(tokens: torch.Tensor, hw_shape: Tuple[int, int],
           shape: Tuple[int, int]) -> torch.Tensor:
    """Tokens (B, H * W, C) of the top-left (h, w) of the grid: (B, h * w, C)."""
    grid = tokens.unflatten(1, hw_shape)  # (B, H, W, C)
    return grid[:, :shape[0], :shape[1]].flatten(1, 2)


# --------------------------------------------------------------------------
# Convolutional stem: timm xcit.ConvPatchEmbed <-> mmsoft ConvPatchEmbed
# --------------------------------------------------------------------------
def stem_pair(patch_size: int, dims: int = 32, seed: int = 0):
    """timm's XCiT stem, mmsoft's stem as UFO-ViT builds it, and the mapping.

    timm's ``proj`` is ``[Seq(conv, bn), GELU, Seq(conv, bn), GELU, ...]``
    (``proj.{2i}.0`` conv without bias, ``proj.{2i}.1`` BN); mmsoft's is
    flat, ``[conv, bn, GELU, conv, bn, GELU, ...]`` (``proj.{3i}``,
    ``proj.{3i+1}``) and its convolutions have biases, set to zero here.
    """
    timm_stem = randomise_(xcit.ConvPatchEmbed(patch_size=patch_size, in_chans=3,
                                               embed_dim=dims), seed)
    layers = 4 if patch_size == 16 else 3
    channels = [3] + [dims // 2**(layers - 1 - i) for i in range(layers)]
    mm_stem = ConvPatchEmbed(channels, [2] * layers, act_layer=nn.GELU,
                             last_act=False).double().eval()
    load_mapped(mm_stem, timm_stem, stem_mapping(channels))
    return timm_stem, mm_stem


def stem_mapping(channels, prefix: str = '') -> Dict[str, Rule]:
    """mmsoft stem key -> timm XCiT stem key (see :func:`stem_pair`)."""
    mapping: Dict[str, Rule] = {}
    for i in range(len(channels) - 1):
        conv, norm = f'{prefix}proj.{3 * i}', f'{prefix}proj.{3 * i + 1}'
        mapping[f'{conv}.weight'] = f'{prefix}proj.{2 * i}.0.weight'
        mapping[f'{conv}.bias'] = torch.zeros(channels[i + 1])  # XCiT: bias=False
        for param in ('weight', 'bias', 'running_mean', 'running_var',
                      'num_batches_tracked'):
            mapping[f'{norm}.{param}'] = f'{prefix}proj.{2 * i}.1.{param}'
    return mapping


@pytest.mark.parametrize('patch_size', [16, 8])
@pytest.mark.parametrize('image_shape', [(37, 53), (64, 48), (16, 16)])
def test_stem_matches_xcit(patch_size, image_shape):
    """Same tokens (B, N, C), grid and input gradient as XCiT's stem, odd
    sizes included (both map a side L to ceil(L / 2) per layer)."""
    timm_stem, mm_stem = stem_pair(patch_size)
    images = randn(2, 3, *image_shape, seed=1)  # (B, 3, H, W)
    timm_out, timm_grad = input_grad(lambda x: timm_stem(x)[0], images, seed=2)
    mm_out, mm_grad = input_grad(lambda x: mm_stem(x)[0], images, seed=2)
    expected_grid = tuple(math.ceil(side / patch_size) for side in image_shape)
    assert timm_stem(images)[1] == mm_stem(images)[1] == expected_grid
    assert_close(mm_out, timm_out, f'stem p{patch_size} {image_shape} tokens')
    assert_close(mm_grad, timm_grad, f'stem p{patch_size} {image_shape} input grad')


def test_stem_conv_bias_is_redundant_before_batchnorm():
    """mmsoft's stem convolutions have biases, XCiT's do not.

    In training (batch statistics) BatchNorm subtracts them out: any bias
    gives XCiT's output. In eval mode a bias ``b`` is the same as a running
    mean lowered by ``b``: loading XCiT weights means ``bias = 0`` (or
    folding it into ``running_mean``), as the mapping of :func:`stem_pair`
    does.
    """
    timm_stem, mm_stem = stem_pair(16)
    images = randn(2, 3, 40, 56, seed=3)
    biases = {}
    with torch.no_grad():
        for i in range(4):
            bias = randn(mm_stem.proj[3 * i].bias.shape[0], seed=10 + i)
            mm_stem.proj[3 * i].bias.copy_(bias)
            biases[i] = bias
    with torch.no_grad():
        eval_diff = assert_differs(mm_stem(images)[0], timm_stem(images)[0],
                                   'stem eval, random conv biases vs XCiT')
        # Folded: running_mean + b cancels the bias exactly.
        for i, bias in biases.items():
            mm_stem.proj[3 * i + 1].running_mean.add_(bias)
        assert_close(mm_stem(images)[0], timm_stem(images)[0],
                     'stem eval, biases folded into running_mean')
        timm_stem.train()
        mm_stem.train()
        assert_close(mm_stem(images)[0], timm_stem(images)[0],
                     'stem train mode (batch statistics), random conv biases')
    assert eval_diff > 0


def test_stem_valid_region_vs_xcit():
    """Padded batch: mmsoft's stem told the valid regions gives each image
    the tokens it has alone; XCiT's (and mmsoft's without regions) lets
    the zero padding, shifted by BN and GELU, leak into the border tokens."""
    timm_stem, mm_stem = stem_pair(16)
    small = randn(1, 3, 37, 45, seed=4)  # alone: (1, 3, 37, 45) -> grid (3, 3)
    large = randn(1, 3, 48, 64, seed=5)  # fills the canvas -> grid (3, 4)
    batch = torch.cat([nn.functional.pad(small, (0, 64 - 45, 0, 48 - 37)), large])
    with torch.no_grad():
        alone, alone_grid = timm_stem(small)  # (1, 9, C), (3, 3)
        mm_tokens, grid, _ = mm_stem(
            batch, regions_on_grid([(37, 45), (48, 64)], batch.shape[-2:]))
        timm_tokens, _ = timm_stem(batch)  # (2, 12, C)
        mm_plain = mm_stem(batch)[0]
    assert grid == (3, 4) and alone_grid == (3, 3)
    assert_close(region(mm_tokens[:1], grid, alone_grid), alone,
                 'stem padded, mmsoft valid region vs image alone')
    assert_close(mm_tokens[1:], timm_stem(large)[0].detach(),
                 'stem padded, mmsoft unpadded image')
    assert_close(mm_plain, timm_tokens, 'stem padded, no valid_shapes vs XCiT')
    assert_differs(region(timm_tokens[:1], grid, alone_grid), alone,
                   'stem padded, XCiT valid region vs image alone')
    outside = mm_tokens[0].unflatten(0, grid)[:, 3:]  # column beyond the region
    assert outside.abs().max() == 0


# --------------------------------------------------------------------------
# Fourier position encoding: timm xcit.PositionalEncodingFourier <->
# mmsoft FourierPositionEncoding
# --------------------------------------------------------------------------
def position_pair(dims: int = 24, hidden: int = 32, seed: int = 6):
    """Mapping: ``proj.*`` <- ``token_projection.*``."""
    timm_pos = randomise_(xcit.PositionalEncodingFourier(hidden_dim=hidden, dim=dims),
                          seed)
    mm_pos = FourierPositionEncoding(dims, hidden).double().eval()
    load_mapped(mm_pos, timm_pos, {'proj.weight': 'token_projection.weight',
                                   'proj.bias': 'token_projection.bias'})
    return timm_pos, mm_pos


@pytest.mark.parametrize('grid', [(1, 1), (3, 5), (7, 4), (14, 14)])
def test_fourier_position_matches_xcit(grid):
    """Same (B, C, H, W) encoding: coordinates 1..H, 1..W over (H + 1e-6),
    times 2 pi, the same frequencies and channel order (y then x)."""
    timm_pos, mm_pos = position_pair()
    with torch.no_grad():
        expected = timm_pos(2, *grid)  # (2, C, H, W)
        actual = mm_pos(2, grid)
    assert_close(actual, expected, f'Fourier encoding {grid}')


def test_fourier_position_valid_region_vs_xcit():
    """Padded batch: mmsoft encodes each image's own grid (its coordinates
    normalised by its own h, w; zero outside), i.e. what XCiT gives the image
    alone. XCiT encodes the padded grid, so an image's region gets other
    coordinates than it has alone."""
    timm_pos, mm_pos = position_pair()
    grid, valid = (7, 5), [(3, 5), (7, 4)]
    with torch.no_grad():
        mm_enc = mm_pos(2, grid, regions_on_grid(valid, grid))  # (2, C, 7, 5)
        timm_enc = timm_pos(2, *grid)
        for i, (h, w) in enumerate(valid):
            alone = timm_pos(1, h, w)[0]  # (C, h, w)
            assert_close(mm_enc[i, :, :h, :w], alone,
                         f'Fourier padded, mmsoft image {i} vs alone')
            outside = torch.ones(grid, dtype=torch.bool)
            outside[:h, :w] = False
            assert mm_enc[i][:, outside].abs().sum() == 0  # zero outside its grid
            assert_differs(timm_enc[i, :, :h, :w], alone,
                           f'Fourier padded, XCiT image {i} vs alone')


# --------------------------------------------------------------------------
# Local patch interaction: timm xcit.LPI <-> mmsoft LocalPatchInteraction
# --------------------------------------------------------------------------
LPI_KEYS = ['conv1.weight', 'conv1.bias', 'bn.weight', 'bn.bias', 'bn.running_mean',
            'bn.running_var', 'bn.num_batches_tracked', 'conv2.weight', 'conv2.bias']


def lpi_pair(dims: int = 16, kernel_size: int = 3, seed: int = 7):
    """Mapping: identical names (``conv1``, ``bn``, ``conv2``)."""
    timm_lpi = randomise_(xcit.LPI(dims, kernel_size=kernel_size), seed)
    mm_lpi = LocalPatchInteraction(dims, kernel_size).double().eval()
    load_mapped(mm_lpi, timm_lpi, {key: key for key in LPI_KEYS})
    return timm_lpi, mm_lpi


@pytest.mark.parametrize('kernel_size', [3, 5])
@pytest.mark.parametrize('grid', [(5, 7), (1, 9), (8, 3)])
def test_lpi_matches_xcit(grid, kernel_size):
    """Same tokens (B, N, C) and input gradient on non-square grids."""
    timm_lpi, mm_lpi = lpi_pair(kernel_size=kernel_size)
    tokens = randn(2, grid[0] * grid[1], 16, seed=8)  # (B, N, C)
    timm_out, timm_grad = input_grad(lambda x: timm_lpi(x, *grid), tokens, seed=9)
    mm_out, mm_grad = input_grad(lambda x: mm_lpi(x, grid), tokens, seed=9)
    assert_close(mm_out, timm_out, f'LPI k{kernel_size} {grid} tokens')
    assert_close(mm_grad, timm_grad, f'LPI k{kernel_size} {grid} input grad')


def test_lpi_valid_region_vs_xcit():
    """Padded batch (padding tokens hold garbage): mmsoft's LPI told the
    valid regions gives the valid tokens their values alone; XCiT's mixes
    padding into the border tokens."""
    timm_lpi, mm_lpi = lpi_pair()
    grid, shape = (5, 6), (3, 4)
    alone = randn(1, 3 * 4, 16, seed=11)  # (1, h * w, C)
    batch = randn(2, 5, 6, 16, seed=12)  # (B, H, W, C), garbage around image 0
    batch[0, :3, :4] = alone[0].unflatten(0, shape)
    batch = batch.flatten(1, 2)  # (B, H * W, C)
    with torch.no_grad():
        expected = timm_lpi(alone, *shape)
        mm_out = mm_lpi(batch, grid, regions_on_grid([shape, grid], grid).padding)
        timm_out = timm_lpi(batch, *grid)
    assert_close(region(batch[:1], grid, shape), alone, 'LPI padded input placement')
    assert_close(region(mm_out[:1], grid, shape), expected,
                 'LPI padded, mmsoft valid region vs alone')
    assert_close(mm_out[1:], timm_out[1:], 'LPI padded, unpadded image')
    assert_differs(region(timm_out[:1], grid, shape), expected,
                   'LPI padded, XCiT valid region vs alone')


def test_stem_and_lpi_train_mode_match_xcit():
    """Training mode (batch statistics): mmsoft's stem and LPI, whose
    backward recomputes BatchNorm's output, give XCiT's outputs, input
    gradients and running statistics (updated once per forward)."""
    for (timm_mod, mm_mod), inputs, call in [
            (stem_pair(16), randn(3, 3, 37, 53, seed=60), None),
            (lpi_pair(), randn(3, 4 * 6, 16, seed=61), (4, 6))]:
        timm_mod.train()
        mm_mod.train()
        if call is None:
            timm_fn, mm_fn = (lambda x: timm_mod(x)[0]), (lambda x: mm_mod(x)[0])
        else:
            timm_fn, mm_fn = (lambda x: timm_mod(x, *call)), (lambda x: mm_mod(x, call))
        what = type(mm_mod).__name__
        timm_out, timm_grad = input_grad(timm_fn, inputs, seed=62)
        mm_out, mm_grad = input_grad(mm_fn, inputs, seed=62)
        assert_close(mm_out, timm_out, f'{what} train mode')
        assert_close(mm_grad, timm_grad, f'{what} train mode input grad')
        timm_stats = {k: v for k, v in timm_mod.state_dict().items() if 'running' in k}
        mm_stats = {k: v for k, v in mm_mod.state_dict().items() if 'running' in k}
        assert len(timm_stats) == len(mm_stats) > 0
        for timm_value, mm_value in zip(timm_stats.values(), mm_stats.values()):
            assert_close(mm_value, timm_value, f'{what} running statistics')


# --------------------------------------------------------------------------
# The attention: timm xcit.XCA <-> mmsoft UFOAttention (different on purpose)
# --------------------------------------------------------------------------
def attention_pair(dims: int = 32, heads: int = 4, seed: int = 13):
    """Mapping: ``qkv.*``, ``proj.*`` identical (both split the QKV output as
    (3, heads, C / heads)); XCA's ``temperature`` (h, 1, 1) has no
    counterpart, UFO's ``gamma_q``, ``gamma_kv`` (h, ) get random values."""
    timm_attn = randomise_(xcit.XCA(dims, heads, qkv_bias=True), seed)
    mm_attn = UFOAttention(dims, heads, qkv_bias=True).double().eval()
    mapping: Dict[str, Rule] = {k: k for k in ('qkv.weight', 'qkv.bias', 'proj.weight',
                                               'proj.bias')}
    mapping['gamma_q'] = randn(heads, seed=seed + 1) / 2 + 1
    mapping['gamma_kv'] = randn(heads, seed=seed + 2) / 2 + 1
    load_mapped(mm_attn, timm_attn, mapping, unmapped_src=['temperature'])
    return timm_attn, mm_attn


def qkv_heads(attn: nn.Module, x: torch.Tensor, heads: int):
    """Q, K, V of shape (B, h, N, d) from an attention's ``qkv`` Linear."""
    batch, tokens, channels = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, heads, channels // heads)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def attend(attn: UFOAttention, x: torch.Tensor) -> torch.Tensor:
    """UFO's attention before its projection: (B, N, C) -> (B, h, N, d)."""
    queries, keys, values = qkv_heads(attn, x, attn.num_heads)
    return ufo_attention(queries, keys, values, attn.gamma_q, attn.gamma_kv, attn.eps)


def merge(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    return x.transpose(1, 2).flatten(2)


def ufo_formula(q, k, v, gamma_q, gamma_kv) -> torch.Tensor:
    """UFO-ViT: ``XNorm(Q) . XNorm(K^T V)``, (B, h, N, d).

    Q normalised per token over its d channels; each column of the d x d
    ``K^T V`` normalised over its d_k entries; per-head scales.
    """
    context = torch.einsum('bhnk,bhnv->bhkv', k, v)  # (B, h, d_k, d_v)
    context = gamma_kv[:, None, None] * context / context.norm(dim=2, keepdim=True)
    q = gamma_q[:, None, None] * q / q.norm(dim=3, keepdim=True)
    return torch.einsum('bhnk,bhkv->bhnv', q, context)


def xca_formula(q, k, v, temperature) -> torch.Tensor:
    """XCiT: ``V . softmax(tau * Q_hat^T K_hat)^T``, (B, h, N, d).

    Q and K normalised per channel over the N tokens; a d x d softmax
    attention between channels, applied to the channels of V.
    """
    q = q / q.norm(dim=2, keepdim=True)
    k = k / k.norm(dim=2, keepdim=True)
    attn = (torch.einsum('bhnk,bhnl->bhkl', q, k) * temperature).softmax(-1)
    return torch.einsum('bhkl,bhnl->bhnk', attn, v)


@pytest.mark.parametrize('tokens', [1, 12, 35])
def test_attention_differs_from_xca(tokens):
    """Same ``qkv``/``proj`` weights: UFO's output differs from XCA's; each
    equals its own formula on the same Q, K, V (so the head layout is
    shared and the difference is the attention itself)."""
    timm_attn, mm_attn = attention_pair()
    x = randn(2, tokens, 32, seed=14)
    with torch.no_grad():
        q, k, v = qkv_heads(timm_attn, x, 4)  # (B, h, N, d) each
        ufo_ref = timm_attn.proj(merge(ufo_formula(q, k, v, mm_attn.gamma_q,
                                                   mm_attn.gamma_kv)))
        xca_ref = timm_attn.proj(merge(xca_formula(q, k, v, timm_attn.temperature)))
        mm_out, timm_out = mm_attn(x), timm_attn(x)
    assert_close(timm_out, xca_ref, f'XCA (N={tokens}) vs XCA formula')
    assert_close(mm_out, ufo_ref, f'UFO (N={tokens}) vs UFO formula')
    assert_differs(mm_out, timm_out, f'UFO vs XCA, same weights (N={tokens})')
    _, mm_grad = input_grad(mm_attn, x, seed=15)
    _, ref_grad = input_grad(lambda y: timm_attn.proj(merge(ufo_formula(
        *qkv_heads(timm_attn, y, 4), mm_attn.gamma_q, mm_attn.gamma_kv))), x, seed=15)
    assert_close(mm_grad, ref_grad, f'UFO (N={tokens}) input grad vs formula')


def test_attention_value_scale_ufo_invariant_xca_linear():
    """Scaling V (its rows of ``qkv``) by c: XCA's pre-projection output,
    a softmax-weighted mix of V's channels, scales by c; UFO's does not
    change, since XNorm divides ``K^T V`` by its norm (the output is a
    cosine times ``gamma_q * gamma_kv``, bounded for any input)."""
    timm_attn, mm_attn = attention_pair()
    x = randn(2, 20, 32, seed=16)
    with torch.no_grad():
        before = merge(attend(mm_attn, x)), timm_attn(x) - timm_attn.proj.bias
        for attn in (timm_attn, mm_attn):
            attn.qkv.weight[64:] *= 7.
            attn.qkv.bias[64:] *= 7.
        after = merge(attend(mm_attn, x)), timm_attn(x) - timm_attn.proj.bias
    assert_close(after[0], before[0], 'UFO attend, V scaled by 7')
    assert_close(after[1], 7. * before[1], 'XCA, V scaled by 7 (x7)')
    bound = (mm_attn.gamma_q * mm_attn.gamma_kv).abs().repeat_interleave(8)
    assert (after[0].abs() <= bound + 1e-12).all()


def test_attention_key_mask_vs_xca_padding():
    """Padded tokens (garbage): UFO told its keys (``key_mask``) gives the valid
    tokens their values alone (``K^T V`` sums only them); XCA has no mask and
    its per-channel norms and sums over tokens take the padding in."""
    timm_attn, mm_attn = attention_pair()
    alone = randn(1, 9, 32, seed=17)
    padded = torch.cat([alone, randn(1, 6, 32, seed=18)], dim=1)  # (1, 15, C)
    key_mask = (torch.arange(15) < 9)[None]  # (B, N), True for the keys
    with torch.no_grad():
        assert_close(mm_attn(padded, key_mask)[:, :9], mm_attn(alone),
                     'UFO padding, valid tokens vs alone')
        assert_differs(timm_attn(padded)[:, :9], timm_attn(alone),
                       'XCA padded, valid tokens vs alone')


# --------------------------------------------------------------------------
# The block: timm xcit.XCABlock with its attention swapped <-> mmsoft UFOBlock
# --------------------------------------------------------------------------
def block_pair(dims: int = 32, heads: int = 4, seed: int = 19):
    """XCiT's block with mmsoft's UFO attention in place of XCA, and UFOBlock.

    Mapping (XCiT names its LPI branch ``norm3``/``local_mp``/``gamma3`` and
    its MLP ``norm2``/``mlp``/``gamma2``; mmsoft numbers them in order):
    ``norm1 <- norm1``, ``attn.* <- attn.*``, ``gamma1 <- gamma1``,
    ``norm2 <- norm3``, ``lpi.* <- local_mp.*``, ``gamma2 <- gamma3``,
    ``norm3 <- norm2``, ``mlp.* <- mlp.*``, ``gamma3 <- gamma2``.
    """
    timm_block = xcit.XCABlock(dims, heads, qkv_bias=True, norm_layer=XCIT_NORM)
    timm_block.attn = UFOAttention(dims, heads, qkv_bias=True)
    randomise_(timm_block, seed)
    mm_block = UFOBlock(dims, heads, qkv_bias=True).double().eval()
    load_mapped(mm_block, timm_block, block_mapping(mm_block.state_dict()))
    return timm_block, mm_block


#: UFOBlock part -> XCABlock part (see :func:`block_pair`).
BLOCK_RENAMES = [('norm1', 'norm1'), ('attn', 'attn'), ('gamma1', 'gamma1'),
                 ('norm2', 'norm3'), ('lpi', 'local_mp'), ('gamma2', 'gamma3'),
                 ('norm3', 'norm2'), ('mlp', 'mlp'), ('gamma3', 'gamma2')]


def block_mapping(mm_keys: Iterable[str], prefix: str = '') -> Dict[str, Rule]:
    """mmsoft UFOBlock key -> timm XCABlock key, both under ``prefix``."""
    mapping: Dict[str, Rule] = {}
    for key in mm_keys:
        local = key[len(prefix):]
        for mm_name, timm_name in BLOCK_RENAMES:
            if local == mm_name or local.startswith(mm_name + '.'):
                mapping[key] = prefix + timm_name + local[len(mm_name):]
    return mapping


@pytest.mark.parametrize('grid', [(3, 5), (6, 2)])
def test_block_is_xcit_block_with_ufo_attention(grid):
    """UFOBlock == XCiT's XCABlock (LN eps 1e-6, branch order attention,
    LPI, MLP, per-channel scales) with XCA replaced by UFO attention."""
    timm_block, mm_block = block_pair()
    x = randn(2, grid[0] * grid[1], 32, seed=20)
    timm_out, timm_grad = input_grad(lambda y: timm_block(y, *grid), x, seed=21)
    mm_out, mm_grad = input_grad(lambda y: mm_block(y, grid), x, seed=21)
    assert_close(mm_out, timm_out, f'UFOBlock vs XCABlock[UFO] {grid}')
    assert_close(mm_grad, timm_grad, f'UFOBlock vs XCABlock[UFO] {grid} input grad')


# --------------------------------------------------------------------------
# The backbone: timm xcit.Xcit (UFO attention swapped in) <-> mmsoft UFOViT
# --------------------------------------------------------------------------
@pytest.mark.parametrize('image_shape', [(40, 72), (64, 48)])
def test_backbone_is_xcit_with_ufo_attention(image_shape):
    """UFOViT's stride-16 output (after block 3 * depth / 4 - 1) equals
    timm's ``Xcit`` with UFO attention in its blocks (stem, ``x + pos``,
    blocks); the stride-32 output is the 2x2 max pool of the last block
    with ``ceil_mode=True``.

    XCiT's own detection backbone (facebookresearch/xcit,
    ``detection/backbone/xcit.py``) pools with ``nn.MaxPool2d(2, 2)``
    (floor): on an odd grid it drops the last row/column, mmsoft keeps it
    (shown on the 3 x 5 grid of a 40 x 72 image). Its detection configs
    read blocks 3, 5, 7, 11 of 12; mmsoft reads evenly spaced blocks
    (2, 5, 8, 11), not compared here.
    """
    from mmsoft.openmmlab import UFOViT
    depth, dims, heads = 4, 32, 2
    timm_net = xcit.Xcit(img_size=64, patch_size=16, embed_dim=dims, depth=depth,
                         num_heads=heads, num_classes=0, cls_attn_layers=0)
    for block in timm_net.blocks:
        block.attn = UFOAttention(dims, heads, qkv_bias=True)
    randomise_(timm_net, 50)
    mm_net = UFOViT(arch=dict(embed_dims=dims, depth=depth, num_heads=heads),
                    out_indices=(2, 3), drop_path_rate=0.).double().eval()
    mm_keys = mm_net.state_dict()
    mapping = stem_mapping([3, dims // 8, dims // 4, dims // 2, dims], 'patch_embed.')
    mapping.update({'pos_embed.proj.weight': 'pos_embed.token_projection.weight',
                    'pos_embed.proj.bias': 'pos_embed.token_projection.bias'})
    for i in range(depth):
        prefix = f'blocks.{i}.'
        mapping.update(block_mapping([k for k in mm_keys if k.startswith(prefix)],
                                     prefix))
    load_mapped(mm_net, timm_net, mapping,
                unmapped_src=['cls_token', 'norm.weight', 'norm.bias'])
    images = randn(2, 3, *image_shape, seed=51)
    with torch.no_grad():
        stride16, stride32 = mm_net(images)  # (B, C, h, w), (B, C, ceil(h/2), ..)
        timm_maps = timm_net.forward_intermediates(images, indices=[2, 3],
                                                   intermediates_only=True)
    assert_close(stride16, timm_maps[0], f'UFOViT stride 16 vs Xcit[UFO] {image_shape}')
    pooled = nn.functional.max_pool2d(timm_maps[1], 2, 2, ceil_mode=True)
    assert_close(stride32, pooled, f'UFOViT stride 32 vs Xcit[UFO] {image_shape}')
    floor = nn.MaxPool2d(2, 2)(timm_maps[1])  # XCiT detection's fpn4
    grid = timm_maps[1].shape[-2:]
    assert stride32.shape[-2:] == tuple(-(-side // 2) for side in grid)
    if any(side % 2 for side in grid):
        assert floor.shape[-2:] != stride32.shape[-2:]
        print(f'grid {tuple(grid)}: mmsoft stride 32 {tuple(stride32.shape[-2:])}, '
              f'XCiT detection {tuple(floor.shape[-2:])}')


# --------------------------------------------------------------------------
# Class attention: timm xcit.ClassAttentionBlock (cait.ClassAttn inside) <->
# mmsoft.models.ufo_vit.ClassAttentionBlock (the classifier's and mmsoft.pretrain's
# head's)
# --------------------------------------------------------------------------
def class_attention_mapping(mm_block: nn.Module,
                            renames: Dict[str, str]) -> Dict[str, Rule]:
    """mmsoft key -> timm key for a class-attention block: ``q`` and ``proj``
    are timm's ``attn.q`` and ``attn.proj``, ``kv`` its ``attn.k`` and ``attn.v``
    concatenated; the LayerScales are renamed by ``renames`` (XCiT ``gamma1``,
    CaiT ``gamma_1``), the rest keeps its name."""
    mapping: Dict[str, Rule] = {}
    for key in mm_block.state_dict():
        name, param = key.rsplit('.', 1) if '.' in key else (key, '')
        if name in ('q', 'proj'):
            mapping[key] = f'attn.{key}'
        elif name == 'kv':
            mapping[key] = (f'attn.k.{param}', f'attn.v.{param}')
        else:
            mapping[key] = renames.get(key, key)
    return mapping


def class_attention_pair(dims: int = 32, heads: int = 4, seed: int = 22):
    """timm's XCiT class-attention block (as ``Xcit`` builds it: LN eps
    1e-6, ``tokens_norm=False``) and mmsoft's, weights copied."""
    from mmsoft.models.ufo_vit import ClassAttentionBlock
    timm_block = randomise_(xcit.ClassAttentionBlock(
        dims, heads, qkv_bias=True, norm_layer=XCIT_NORM, eta=1e-5,
        tokens_norm=False), seed)
    mm_block = ClassAttentionBlock(dims, heads).double().eval()
    load_mapped(mm_block, timm_block, class_attention_mapping(mm_block, {}))
    return timm_block, mm_block


@pytest.mark.parametrize('tokens', [1, 16, 35])
def test_classifier_block_is_xcits_layer(tokens):
    """The class-attention block (``UFOViT(global_pool='token')`` and the
    pre-training head) is XCiT's class-attention layer as ``Xcit`` chains it:
    the whole output, class token and patch tokens, and the input gradients.

    The XCiT block (timm, as the official code) is checked against its
    formula too, with ``c1 = cls + g1 * ClassAttn(LN1([cls; p]))``: class
    token ``LN2(c1) + g2 * FFN(LN2(c1))`` (the FFN residual starts from the
    normalised token) and patch tokens ``2 * (p + g1 * LN1([cls; p])[1:])``.
    """
    timm_block, mm_block = class_attention_pair(seed=29)
    joint = randn(2, 1 + tokens, 32, seed=30)  # (B, 1 + N, C)
    timm_out, timm_grad = input_grad(timm_block, joint, seed=31)
    mm_out, mm_grad = input_grad(mm_block, joint, seed=31)
    assert_close(mm_out, timm_out, f'classifier block vs XCiT (N={tokens})')
    assert_close(mm_grad, timm_grad,
                 f'classifier block input grad vs XCiT (N={tokens})')
    cls_token, patches = joint[:, :1], joint[:, 1:]
    with torch.no_grad():
        t = timm_block
        c1 = cls_token + t.gamma1 * t.attn(t.norm1(joint))  # (B, 1, C)
        assert_close(timm_out[:, :1], t.norm2(c1) + t.gamma2 * t.mlp(t.norm2(c1)),
                     f'XCiT CA (N={tokens}) vs formula')
        assert_close(timm_out[:, 1:], 2 * (patches + t.gamma1 * t.norm1(joint)[:, 1:]),
                     f'XCiT CA (N={tokens}) patches')


def test_class_attention_is_xcit_not_cait():
    """XCiT's block is not CaiT's (timm ``cait.LayerScaleBlockClassAttn``,
    the same ``ClassAttn``): CaiT adds the FFN to the un-normalised class
    token, ``c1 + g2 * FFN(LN2(c1))``. mmsoft follows XCiT, so with the same
    weights it differs from CaiT's block by ``c1 - LN2(c1)``."""
    from mmsoft.models.ufo_vit import ClassAttentionBlock
    timm_block = randomise_(cait.LayerScaleBlockClassAttn(
        32, 4, qkv_bias=True, norm_layer=XCIT_NORM), 26)
    mm_block = ClassAttentionBlock(32, 4).double().eval()
    load_mapped(mm_block, timm_block, class_attention_mapping(
        mm_block, {'gamma1': 'gamma_1', 'gamma2': 'gamma_2'}))
    cls_token, patches = randn(2, 1, 32, seed=27), randn(2, 16, 32, seed=28)
    with torch.no_grad():
        cait_cls = timm_block(patches, cls_token)  # (B, 1, C)
        mm_cls = mm_block(torch.cat([cls_token, patches], 1))[:, :1]
        t = timm_block
        c1 = cls_token + t.gamma_1 * t.attn(t.norm1(torch.cat([cls_token, patches], 1)))
        expected_gap = t.norm2(c1) - c1
    assert_differs(mm_cls, cait_cls, 'mmsoft CA vs CaiT block, same weights')
    assert_close(mm_cls - cait_cls, expected_gap, 'mmsoft CA - CaiT = LN2(c1) - c1')


def test_two_class_attention_layers_match_xcit():
    """Two layers chained on the joint sequence, as XCiT's model (and
    mmsoft's classifier and head) runs them: the second reads the first
    one's changed patch tokens."""
    pairs = [class_attention_pair(seed=30), class_attention_pair(seed=40)]
    x = randn(2, 17, 32, seed=29)  # (B, 1 + N, C)
    with torch.no_grad():
        timm_x, mm_x = x, x
        for timm_block, mm_block in pairs:
            timm_x, mm_x = timm_block(timm_x), mm_block(mm_x)
    assert_close(mm_x, timm_x, 'two CA layers vs XCiT')
