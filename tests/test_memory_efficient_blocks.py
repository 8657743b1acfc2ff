"""Norms, LayerScale, stems and whole backbones that keep less for backward
give the plain autograd outputs and gradients, and keep what they say.

The plain computation is a copy with the memory-efficient switch off
(every operation then recorded by autograd as written); the UFO block's
LayerScale, folded into each branch's last layer, is compared with
``gamma * branch(x)`` written out.
"""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft_analysis.saved_tensors import SavedTensorRecorder
from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.models.common import MLP, ConvPatchEmbed, regions_on_grid
from mmsoft.models.ufo_vit import UFOBlock
from mmsoft.models.common import set_memory_efficient
from mmsoft.models.common import fusable

from tests.helpers.plain_autograd import (TOLERANCE, assert_same_as_plain,
                                          outputs_and_gradients)


#: The layers whose weight is a per-channel scale.
NORMS = (nn.LayerNorm, _BatchNorm, nn.GroupNorm)


def randomise_affine(module: nn.Module, seed: int = 0) -> nn.Module:
    """Scales (the weights of :data:`NORMS` layers, ``gamma*`` parameters:
    LayerScale, XNorm) in [0.5, 1.5] and small biases, so that neither is
    trivial.

    Raises:
        ValueError: When ``module`` has no such scale.
    """
    scales = {id(layer.weight) for layer in module.modules()
              if isinstance(layer, NORMS) and layer.weight is not None}
    scales |= {id(param) for name, param in module.named_parameters()
               if name.rsplit('.', 1)[-1].startswith('gamma')}
    if not scales:
        raise ValueError(f'module={type(module).__name__} has no scale to '
                         f'randomise; expected {[n.__name__ for n in NORMS]} '
                         "layers or 'gamma*' parameters.")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if id(param) in scales:
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif name.endswith('bias'):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return module


def test_randomise_affine_reaches_every_scale():
    stem = randomise_affine(ConvPatchEmbed([3, 8, 8, 12], [2, 1, 2]))
    norms = [layer for layer in stem.modules() if isinstance(layer, _BatchNorm)]
    assert len(norms) == 3
    assert all(0.5 <= norm.weight.min() and norm.weight.max() < 1.5
               and norm.weight.std() > 0 for norm in norms)
    block = randomise_affine(UFOBlock(16, num_heads=2))
    assert all((param != 1).all() for name, param in block.named_parameters()
               if name.rsplit('.', 1)[-1].startswith('gamma'))
    with pytest.raises(ValueError, match='module=Linear has no scale to randomise'):
        randomise_affine(nn.Linear(3, 4))


class _WrittenOutUFOBlock(nn.Module):
    """A UFO block computing ``x + gamma * branch(x)`` literally."""

    def __init__(self, block: UFOBlock):
        super().__init__()
        self.block = block

    def forward(self, x, hw_shape):
        block = self.block
        x = x + block.gamma1 * block.attn(block.norm1(x))
        x = x + block.gamma2 * block.lpi(block.norm2(x), hw_shape)
        return x + block.gamma3 * block.mlp(block.norm3(x))


def test_layer_scales_in_their_branches_equal_gamma_times_branch():
    torch.manual_seed(0)
    block = randomise_affine(UFOBlock(16, num_heads=2)).double()
    tokens = torch.randn(2, 30, 16, dtype=torch.float64)
    plain_copy = assert_same_as_plain(block, [tokens], (5, 6))
    assert not any(m.memory_efficient for m in plain_copy.modules()
                   if hasattr(m, 'memory_efficient'))
    for memory_efficient in (True, False):
        folded_block = set_memory_efficient(copy.deepcopy(block), memory_efficient)
        written_out = _WrittenOutUFOBlock(
            set_memory_efficient(copy.deepcopy(block), memory_efficient))
        folded = outputs_and_gradients(folded_block, [tokens], (5, 6))
        plain = outputs_and_gradients(written_out, [tokens], (5, 6))
        torch.testing.assert_close(folded[0], plain[0], **TOLERANCE)
        torch.testing.assert_close(folded[1], plain[1], **TOLERANCE)
        for name, grad in folded[2].items():
            torch.testing.assert_close(grad, plain[2]['block.' + name], **TOLERANCE,
                                       msg=name)


@pytest.mark.parametrize('valid_shapes', [None, [(5, 6), (3, 4)]])
def test_ufo_block_equals_plain_and_updates_stats_once(valid_shapes):
    """Each LayerNorm keeping its input only, the layer scales in their
    branches' last layers, the local patch interaction recomputed: the plain
    block's outputs, gradients and BatchNorm statistics, updated once."""
    torch.manual_seed(0)
    block = randomise_affine(UFOBlock(16, num_heads=2)).double().train()
    tokens = 1 + torch.randn(2, 30, 16, dtype=torch.float64)
    regions = regions_on_grid(valid_shapes, (5, 6))
    reference = assert_same_as_plain(block, [tokens], (5, 6), regions)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(block.named_buffers())[name], buffer,
                                   rtol=0, atol=1e-12, msg=name)
    assert int(block.lpi.bn.num_batches_tracked) == 1


class _StemTokens(nn.Module):
    """A stem's tokens on given valid regions, for the helpers above."""

    def __init__(self, stem, valid_shapes):
        super().__init__()
        self.stem = stem
        self.valid_shapes = valid_shapes

    def forward(self, x):
        return self.stem(x, regions_on_grid(self.valid_shapes, x.shape[-2:]))[0]


@pytest.mark.parametrize('valid_shapes', [None, [(20, 24), (13, 9)]])
def test_conv_stem_equals_plain_and_updates_stats_once(valid_shapes):
    torch.manual_seed(0)
    stem = randomise_affine(ConvPatchEmbed([3, 8, 8, 12], [2, 1, 2])).double().train()
    image = torch.randn(2, 3, 20, 24, dtype=torch.float64)
    efficient = _StemTokens(stem, valid_shapes)
    reference = assert_same_as_plain(efficient, [image])
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(efficient.named_buffers())[name], buffer,
                                   rtol=0, atol=0, msg=name)
    assert all(int(b) == 1 for n, b in efficient.named_buffers()
               if n.endswith('num_batches_tracked'))


def test_conv_stem_keeps_only_batchnorm_inputs():
    stem = ConvPatchEmbed([3, 8, 8, 12], [2, 1, 2]).train()
    image = torch.randn(1, 3, 20, 24, requires_grad=True)
    with SavedTensorRecorder(stem) as recorder:
        stem(image * 1)
    maps = sorted(r.shape for r in recorder.records if len(r.shape) == 4
                  and r.shape[0] == 1)
    # The image, recomputing the first conv's output (the first BatchNorm's
    # input) from it, and the other BatchNorms' inputs: no activation output,
    # no second copy at any resolution.
    assert maps == [(1, 3, 20, 24), (1, 8, 10, 12), (1, 12, 5, 6)]


@pytest.mark.parametrize('valid_shapes', [None, [(20, 24), (13, 17)]])
def test_conv_stem_recomputing_its_first_conv_equals_plain_autograd(valid_shapes):
    torch.manual_seed(0)
    stem = ConvPatchEmbed([3, 8, 8, 12], [2, 1, 2]).double().train()
    image = torch.randn(2, 3, 20, 24, dtype=torch.float64)
    reference = assert_same_as_plain(_StemTokens(stem, valid_shapes), [image])
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(stem.named_buffers())['.'.join(
            name.split('.')[1:])], buffer, rtol=0, atol=0, msg=name)
    # Without an image's gradient, the first conv's weight gradient alone.
    stem.zero_grad()
    stem(image)[0].sum().backward()
    assert stem.proj[0].weight.grad is not None and image.grad is None


def test_conv_stem_with_sync_batchnorm_runs_plainly():
    stem = ConvPatchEmbed([3, 8, 12], [2, 2])
    stem.proj[1] = nn.SyncBatchNorm(8)
    assert not fusable(list(stem.proj), 1)
    assert fusable(list(stem.proj), 4)


class _SummedBackbone(nn.Module):
    """A backbone's maps, flattened into one tensor."""

    def __init__(self, backbone, valid_shapes):
        super().__init__()
        self.backbone = backbone
        self.valid_shapes = valid_shapes

    def forward(self, x):
        return torch.cat([out.flatten() for out in self.backbone(x, self.valid_shapes)])


@pytest.mark.parametrize('valid_shapes', [None, [(64, 96), (40, 70)]])
@pytest.mark.parametrize('build', [
    lambda: SOFT('tiny', solver='newton_closed_form', drop_path_rate=0.,
                 kernel_chunk_tokens=100),
    lambda: SOFT('tiny', variant='soft', solver='newton', drop_path_rate=0.),
    lambda: UFOViT('tiny', drop_path_rate=0.),
    lambda: SOFT('tiny', solver='newton_closed_form', drop_path_rate=0.,
                 recompute_mlp=True),
    lambda: UFOViT('tiny', drop_path_rate=0., recompute_mlp=True),
], ids=['soft++-closed-form-chunked', 'soft-newton', 'ufo-vit',
        'soft++-recompute-mlp', 'ufo-vit-recompute-mlp'])
def test_backbones_equal_plain_autograd(build, valid_shapes):
    torch.manual_seed(0)
    backbone = randomise_affine(build()).double().train()
    image = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    summed = _SummedBackbone(backbone, valid_shapes)
    reference = assert_same_as_plain(summed, [image])
    buffers = dict(backbone.named_buffers(prefix='backbone'))
    # BatchNorm running statistics are updated once, as by the plain computation
    # up to float64 rounding (UFO-ViT's LPI applies its LayerNorm's affine as a
    # multiply-add of its own); a second update would move them by
    # momentum * value, orders of magnitude more.
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(buffers[name], buffer, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize('build', [
    lambda **kw: SOFT('tiny', drop_path_rate=0., **kw),
    lambda **kw: UFOViT('tiny', drop_path_rate=0., **kw),
], ids=['soft', 'ufo-vit'])
def test_memory_efficient_switch_of_the_backbones(build):
    """``memory_efficient=False`` switches every layer to plain autograd:
    the same outputs and gradients, more kept for backward."""
    torch.manual_seed(0)
    efficient = randomise_affine(build()).double().train()
    plain = build(memory_efficient=False).double().train()
    plain.load_state_dict(efficient.state_dict())
    switchable = [m for m in plain.modules() if hasattr(m, 'memory_efficient')]
    assert switchable and not any(m.memory_efficient for m in switchable)
    assert all(m.memory_efficient for m in efficient.modules()
               if hasattr(m, 'memory_efficient'))
    image = torch.randn(1, 3, 64, 96, dtype=torch.float64)
    # Activations only: weights (a Linear's as its transpose) would outweigh
    # them at this tiny input.
    weight_shapes = {tuple(p.shape) for p in efficient.parameters()}
    weight_shapes |= {shape[::-1] for shape in weight_shapes}
    kept, results = {}, {}
    for name, backbone in (('efficient', efficient), ('plain', plain)):
        wrapper = _SummedBackbone(backbone, None)
        results[name] = outputs_and_gradients(wrapper, [image])
        # What the forward pass keeps for backward; backward's own
        # temporaries are freed as it goes (their addresses are reused).
        with SavedTensorRecorder(backbone) as recorder:
            wrapper(image.clone().requires_grad_())
        kept[name] = sum(record.nbytes for record in recorder.records
                         if record.shape not in weight_shapes)
    torch.testing.assert_close(results['efficient'][0], results['plain'][0],
                               **TOLERANCE)
    for param_name, grad in results['plain'][2].items():
        torch.testing.assert_close(results['efficient'][2][param_name], grad,
                                   **TOLERANCE, msg=param_name)
    assert kept['plain'] > 1.3 * kept['efficient']


def test_recompute_mlp_needs_the_memory_efficient_path():
    with pytest.raises(ValueError, match=r'recompute_mlp=True needs memory_efficient'):
        SOFT('tiny', recompute_mlp=True, memory_efficient=False)
    with pytest.raises(ValueError, match=r'memory_efficient=1 is invalid'):
        UFOViT('tiny', memory_efficient=1)


@pytest.mark.parametrize('build', [
    lambda **kw: SOFT('tiny', drop_path_rate=0., **kw),
    lambda **kw: UFOViT('tiny', drop_path_rate=0., **kw),
], ids=['soft', 'ufo-vit'])
def test_recompute_mlp_keeps_no_hidden_layer(build):
    """With ``recompute_mlp`` every MLP keeps one tensor less for backward: its
    hidden layer (B, N, hidden), which it recomputes."""
    image = torch.randn(1, 3, 64, 64)
    kept_hidden = {}
    for recompute in (False, True):
        backbone = build(recompute_mlp=recompute).train()
        mlps = {name.rsplit('.', 1)[0]: mlp for name, mlp in backbone.named_modules()
                if isinstance(mlp, MLP)}  # the block holding each MLP -> it
        assert all(mlp.keep_hidden is not recompute for mlp in mlps.values())
        with SavedTensorRecorder(backbone) as recorder:
            backbone(image)
        # The ops run the MLPs in their blocks' scope: (B, N, hidden) there.
        kept_hidden[recompute] = [
            r for r in recorder.records if r.module in mlps and len(r.shape) == 3
            and r.shape[-1] == mlps[r.module].fc1.out_features]
    assert len(kept_hidden[False]) - len(kept_hidden[True]) == len(mlps)
