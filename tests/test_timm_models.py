"""mmsoft's models through timm, beyond timm's own model tests
(tests/vendor/timm): the registry, the classifier and feature API details
those leave out, official SOFT files loaded as
``pretrained_cfg_overlay=dict(file=...)`` and mmpretrain's TIMMBackbone."""

import pytest
import torch

timm = pytest.importorskip('timm')
import mmsoft  # noqa: E402,F401  (registers the models with timm)
from mmsoft import timm_models  # noqa: E402
from tests.helpers import official_soft_reference as ref  # noqa: E402

pytestmark = [pytest.mark.torchvision, pytest.mark.frameworks]

NAMES = sorted(timm_models.default_cfgs)
#: One model of each family and variant, small enough to run on the CPU.
TINY = ['soft_tiny', 'soft_plus_plus_tiny', 'ufo_vit_tiny']
SIZE = 64


def images(batch=1, size=SIZE, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=generator)


def test_every_size_is_registered():
    assert set(timm.list_models('soft_*')) == {
        f'{prefix}_{size}' for prefix in ('soft', 'soft_plus_plus')
        for size in ('tiny', 'small', 'medium', 'large', 'huge')}
    assert set(timm.list_models('ufo_vit_*')) == {
        f'ufo_vit_{size}' for size in ('tiny', 'small', 'medium', 'base')}
    assert set(timm.list_models(module='timm_models')) == set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_every_model_builds_as_classifier_and_feature_extractor(name):
    classifier = timm.create_model(name, device='meta')  # shapes, no weights
    assert classifier.num_classes == 1000
    assert classifier.head.weight.shape == (1000, classifier.num_features)
    cfg = classifier.pretrained_cfg
    assert cfg['classifier'] == 'head' and cfg['num_classes'] == 1000
    assert f'{cfg["first_conv"]}.weight' in classifier.state_dict()
    features = timm.create_model(name, features_only=True, device='meta')
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    assert len(features.feature_info.channels()) == 4
    assert not any('head' in key for key in features.state_dict())


@pytest.mark.parametrize('name', TINY)
def test_without_classifier_forward_returns_pre_logits(name):
    model = timm.create_model(name).eval()
    x = images()
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)
        pooled = model(x)
    torch.testing.assert_close(pooled, pre)


@pytest.mark.parametrize('name', TINY)
def test_features_only_maps_of_chosen_outputs_match_feature_info(name):
    out_indices = (1, 3)
    model = timm.create_model(name, features_only=True, out_indices=out_indices)
    x = images(batch=2, size=96)
    outs = model(x)
    info = model.feature_info
    assert len(outs) == len(out_indices) == len(info.channels())
    for channels, reduction, out in zip(info.channels(), info.reduction(), outs):
        assert out.shape == (2, channels, 96 // reduction, 96 // reduction)
        assert not out.isnan().any()
    # Only what the chosen maps need is built (UFO-ViT's pyramid builds the
    # branches of out_indices): every parameter gets a gradient, as DDP
    # without find_unused_parameters requires.
    sum(out.sum() for out in outs).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize('name', TINY)
def test_forward_intermediates_at_feature_info_strides(name):
    model = timm.create_model(name).eval()
    x = images(size=96)
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    with torch.no_grad():
        _, maps = model.forward_intermediates(x)
        assert len(maps) == len(info.channels()) == 4
        for channels, reduction, out in zip(info.channels(), info.reduction(), maps):
            assert out.shape == (1, channels, 96 // reduction, 96 // reduction)
    last_two = model.forward_intermediates(x, indices=2, intermediates_only=True)
    assert [m.shape[1] for m in last_two] == info.channels()[2:]


@pytest.mark.parametrize('name', TINY)
def test_out_indices_follow_timm_negative_and_last_n(name):
    """``(-2, -1)`` and ``2`` (the last two) are ``(2, 3)``, as for every timm
    model; transformers' TimmBackboneConfig defaults to ``(-1,)``."""
    def maps(out_indices):
        torch.manual_seed(0)
        model = timm.create_model(name, features_only=True, out_indices=out_indices)
        assert model.feature_info.reduction() == [16, 32]
        with torch.no_grad():
            return model.eval()(images())
    expected = maps((2, 3))
    for out_indices in ((-2, -1), (2, -1), 2):
        torch.testing.assert_close(maps(out_indices), expected, rtol=0, atol=0)


@pytest.mark.parametrize('name', TINY)
def test_output_stride_other_than_32_is_refused(name):
    message = (rf'output_stride=16 is not supported by {name}, which has no dilated '
               r'mode; expected 32')
    with pytest.raises(ValueError, match=message):
        timm.create_model(name, features_only=True, output_stride=16)
    for output_stride in (32, None):
        model = timm.create_model(name, features_only=True, output_stride=output_stride,
                                  device='meta')
        assert model.feature_info.reduction() == [4, 8, 16, 32]


@pytest.mark.parametrize('name', TINY)
def test_torch_jit_script_is_refused_with_the_routes_that_work(name):
    for model in (timm.create_model(name, device='meta'),
                  timm.create_model(name, features_only=True, device='meta')):
        with pytest.raises(RuntimeError, match='cannot be scripted with torch.jit.'
                                               'script; export it with torch.export'):
            torch.jit.script(model)


def test_unknown_intermediate_index_is_refused():
    model = timm.create_model('soft_tiny')
    with pytest.raises(ValueError, match=r'indices=\[0, 4\] is invalid'):
        model.forward_intermediates(images(), indices=[0, 4])


@pytest.mark.parametrize('variant,name', [('soft', 'soft_tiny'),
                                          ('soft++', 'soft_plus_plus_tiny')])
def test_official_checkpoint_file_loads_as_pretrained(variant, name, tmp_path):
    official = ref.random_official_state_dict(seed=0, num_classes=1000)
    path = str(tmp_path / 'soft_tiny_official.pth')
    torch.save(official, path)
    model = timm.create_model(name, pretrained=True,
                              pretrained_cfg_overlay=dict(file=path)).eval()
    torch.testing.assert_close(model.head.weight, official['head.weight'])
    x = images(size=224)
    with torch.no_grad():
        maps = model.forward_intermediates(x, intermediates_only=True)
        expected = ref.official_soft_forward(
            {k: v.double() for k, v in official.items()}, x.double(), (2, 4, 10, 16),
            variant)  # batch 1: the reference's batch-wide Newton scale is per image
    for out, exp in zip(maps, expected):
        assert (out.double() - exp).abs().max().item() < 2e-3
    features = timm.create_model(name, pretrained=True, features_only=True,
                                 pretrained_cfg_overlay=dict(file=path)).eval()
    with torch.no_grad():
        for out, exp in zip(features(x), maps):
            torch.testing.assert_close(out, exp)


@pytest.mark.openmmlab
@pytest.mark.parametrize('name', ['soft_plus_plus_tiny', 'ufo_vit_tiny'])
def test_mmpretrain_timm_backbone_builds_them(name):
    from mmpretrain.models.backbones import TIMMBackbone
    backbone = TIMMBackbone(model_name=name, features_only=True, pretrained=False,
                            out_indices=(0, 1, 2, 3))
    backbone.eval()  # (mmpretrain's train() returns None: no chaining)
    with torch.no_grad():
        maps = backbone(images(batch=2, size=96))
    assert [m.shape[-1] for m in maps] == [24, 12, 6, 3]
