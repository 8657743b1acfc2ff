"""The adapters: the same weights give the same four maps through each
framework, and :func:`mmsoft.torchvision_models.fpn_backbone` builds
torchvision's detection backbone.

Each adapter's maps are compared with the plain model's
(:class:`mmsoft.models.SOFT`, :class:`mmsoft.models.UFOViT`), whose state dict
is loaded strictly into the model inside the adapter: timm's
``features_only`` model, transformers' ``TimmBackbone``, the body of
``fpn_backbone`` and the OpenMMLab classes built by type. Each adapter runs
where its framework is installed: the OpenMMLab one is marked ``openmmlab``
(the stack and floor environments), the others ``frameworks`` (the newest
and stack environments).
"""
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import mmsoft  # noqa: F401  (registers the models with timm and mmengine)
from mmsoft.models import SOFT, UFOViT

NAMES = ['soft_plus_plus_tiny', 'ufo_vit_tiny']
#: The plain model each timm name builds.
PLAIN = {'soft_plus_plus_tiny': lambda: SOFT(arch='tiny', variant='soft++'),
         'ufo_vit_tiny': lambda: UFOViT(arch='tiny')}
#: The OpenMMLab config of each.
OPENMMLAB = {'soft_plus_plus_tiny': dict(type='SOFT', arch='tiny', variant='soft++'),
             'ufo_vit_tiny': dict(type='UFOViT', arch='tiny')}


def _timm(name):
    timm = pytest.importorskip('timm')
    model = timm.create_model(name, features_only=True, out_indices=(0, 1, 2, 3))
    return model, model.model, lambda x: list(model(x))


def _transformers(name):
    pytest.importorskip('timm')
    transformers = pytest.importorskip('transformers')
    backbone = transformers.AutoBackbone.from_config(transformers.TimmBackboneConfig(
        backbone=name, use_pretrained_backbone=False, out_indices=(0, 1, 2, 3)))
    return backbone, backbone._backbone.model, \
        lambda x: list(backbone(pixel_values=x).feature_maps)


def _torchvision(name):
    pytest.importorskip('torchvision')
    from mmsoft.torchvision_models import fpn_backbone
    backbone = fpn_backbone(name)
    return backbone, backbone.body, lambda x: list(backbone.forward_body(x).values())


def _openmmlab(name):
    registry = pytest.importorskip('mmengine.registry')
    model = registry.MODELS.build(OPENMMLAB[name])
    return model, model, lambda x: list(model(x))


#: Adapter -> its builder: (the adapter, the mmsoft model inside, maps of x).
ADAPTERS = {
    'timm': pytest.param(_timm, marks=pytest.mark.frameworks, id='timm'),
    'transformers': pytest.param(_transformers, marks=pytest.mark.frameworks,
                                 id='transformers'),
    'torchvision': pytest.param(_torchvision, marks=pytest.mark.frameworks,
                                id='torchvision'),
    'openmmlab': pytest.param(_openmmlab, marks=pytest.mark.openmmlab, id='openmmlab'),
}


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('build', list(ADAPTERS.values()))
def test_same_weights_same_maps(build, name):
    torch.manual_seed(1)
    plain = PLAIN[name]().eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = plain.forward_intermediates(x, intermediates_only=True)
    torch.manual_seed(2)  # other weights until the plain model's are loaded
    adapter, inner, maps_of = build(name)
    adapter.eval()
    assert isinstance(inner, type(plain))
    with torch.no_grad():
        before = maps_of(x)
    assert not torch.equal(before[-1], expected[-1])
    inner.load_state_dict(plain.state_dict(), strict=True)
    with torch.no_grad():
        maps = maps_of(x)
    assert [tuple(m.shape) for m in maps] == [tuple(m.shape) for m in expected]
    assert [m.shape[-2:] for m in maps] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    for i, (got, want) in enumerate(zip(maps, expected)):
        assert torch.equal(got, want), \
            f'map {i}: max difference {(got - want).abs().max().item():.3g}'


# ----------------------------------------------------------- fpn_backbone ---
@pytest.fixture(scope='module')
def torchvision_models():
    pytest.importorskip('torchvision')
    import mmsoft.torchvision_models
    return mmsoft.torchvision_models


@pytest.mark.frameworks
@pytest.mark.parametrize('name', NAMES)
def test_fpn_backbone_maps(torchvision_models, name):
    x = torch.randn(2, 3, 64, 96)
    backbone = torchvision_models.fpn_backbone(name, out_channels=32).eval()
    assert backbone.out_channels == 32
    with torch.no_grad():
        body = backbone.forward_body(x)
        out = backbone(x)
    assert isinstance(body, OrderedDict) and isinstance(out, OrderedDict)
    channels = [info['num_chs'] for info in backbone.body.feature_info]
    assert [(k, tuple(m.shape)) for k, m in body.items()] == [
        (str(i), (2, c, 64 // 2**(i + 2), 96 // 2**(i + 2)))
        for i, c in enumerate(channels)]
    assert [(k, tuple(m.shape)) for k, m in out.items()] == [
        ('0', (2, 32, 16, 24)), ('1', (2, 32, 8, 12)), ('2', (2, 32, 4, 6)),
        ('3', (2, 32, 2, 3)), ('pool', (2, 32, 1, 2))]
    assert torch.equal(out['pool'], nn.functional.max_pool2d(out['3'], 1, 2))

    retina = torchvision_models.fpn_backbone(
        name, out_channels=32, out_indices=(1, 2, 3), extra_blocks='p6p7').eval()
    with torch.no_grad():
        out = retina(x)
    assert [(k, tuple(m.shape)) for k, m in out.items()] == [
        ('0', (2, 32, 8, 12)), ('1', (2, 32, 4, 6)), ('2', (2, 32, 2, 3)),
        ('p6', (2, 32, 1, 2)), ('p7', (2, 32, 1, 1))]

    bare = torchvision_models.fpn_backbone(name, out_channels=32, out_indices=(0, 2),
                                           extra_blocks='none').eval()
    with torch.no_grad():
        assert list(bare(x)) == ['0', '1']
        assert [m.shape[1] for m in bare.forward_body(x).values()] == \
            [channels[0], channels[2]]


@pytest.mark.frameworks
@pytest.mark.parametrize('out_channels', [64, 192])
def test_fpn_p6_reads_the_last_body_map(torchvision_models, out_channels):
    """P6 comes from the last body map (UFO-ViT-tiny's are 192 wide), also
    when it is as wide as the FPN, where torchvision's block reads P5."""
    x = torch.randn(1, 3, 64, 96)
    backbone = torchvision_models.fpn_backbone(
        'ufo_vit_tiny', out_channels=out_channels, out_indices=(1, 2, 3),
        extra_blocks='p6p7').eval()
    with torch.no_grad():
        body = backbone.forward_body(x)
        out = backbone(x)
        p6 = backbone.fpn.extra_blocks.p6(body['2'])
    assert torch.equal(out['p6'], p6)
    if out_channels == 192:  # P5 has the width of P6's input too: not read
        with torch.no_grad():
            assert not torch.equal(out['p6'], backbone.fpn.extra_blocks.p6(out['2']))


@pytest.mark.frameworks
def test_fpn_backbone_from_a_name_or_a_model(torchvision_models):
    timm_models = pytest.importorskip('mmsoft.timm_models')
    assert list(torchvision_models.MODEL_CONFIGS) == list(timm_models.default_cfgs)
    backbone = torchvision_models.fpn_backbone('soft_tiny', solver='exact',
                                               drop_path_rate=0.)
    assert isinstance(backbone.body, SOFT)
    assert (backbone.body.variant, backbone.body.solver) == ('soft', 'exact')
    model = UFOViT(arch='tiny', out_indices=(1, 2, 3))
    backbone = torchvision_models.fpn_backbone(model, out_indices=(1, 2, 3))
    assert backbone.body is model
    assert list(backbone.state_dict())[0].startswith('body.')
    extra = torchvision_models.LastLevelP6P7(32, 32)
    assert torchvision_models.fpn_backbone(
        'ufo_vit_tiny', out_channels=32, extra_blocks=extra).fpn.extra_blocks is extra


@pytest.mark.frameworks
@pytest.mark.parametrize('model, kwargs, error, words', [
    ('soft_plus_plus_tinyy', {}, ValueError, ["'soft_plus_plus_tinyy'", 'ufo_vit_base',
                                              'soft_tiny']),
    (42, {}, TypeError, ['int', 'soft_plus_plus_tiny']),
    (nn.Conv2d(3, 8, 3), {}, TypeError, ['Conv2d', 'SOFT or UFOViT']),
    (lambda: SOFT(arch='tiny'), dict(solver='exact'), TypeError, ["['solver']"]),
    ('soft_tiny', dict(variant='soft++'), ValueError, ["['variant']", "'soft_tiny'"]),
    (lambda: UFOViT(arch='tiny', multi_scale=False), {}, ValueError, ['multi_scale']),
    (lambda: UFOViT(arch='tiny', out_indices=(2, 3)), {}, ValueError,
     ['[0, 1]', '(2, 3)']),
    ('ufo_vit_tiny', dict(extra_blocks='p6'), ValueError,
     ["'p6'", "'max_pool'", "'p6p7'", "'none'", 'ExtraFPNBlock']),
    ('ufo_vit_tiny', dict(extra_blocks=None), ValueError, ['extra_blocks=None']),
    ('ufo_vit_tiny', dict(out_channels=0), ValueError, ['out_channels=0']),
    ('ufo_vit_tiny', dict(out_indices=(3, 4)), ValueError, ['out_indices=(3, 4)']),
], ids=['unknown-name', 'not-a-model', 'other-module', 'kwargs-with-model',
        'fixed-argument', 'single-scale', 'missing-branches', 'extra-blocks-name',
        'extra-blocks-none', 'out-channels', 'out-indices'])
def test_fpn_backbone_rejects(torchvision_models, model, kwargs, error, words):
    if callable(model) and not isinstance(model, nn.Module):
        model = model()
    with pytest.raises(error) as info:
        torchvision_models.fpn_backbone(model, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)
