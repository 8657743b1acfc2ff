"""Checkpoints of earlier layouts load strictly under the current keys, with
a ``DeprecationWarning`` naming the new key; options have one spelling."""
import json
import os.path as osp
import re

import pytest
import torch

from mmsoft.deprecations import renamed_state_dict_keys
from mmsoft.models import SOFT as PlainSOFT
from mmsoft.models import UFOViT as PlainUFOViT
from mmsoft.openmmlab import SOFT, UFOViT

TINY_UFO = dict(embed_dims=32, depth=4, num_heads=2)
SMALL_SOFT = dict(embed_dims=[16, 32, 64, 64], num_heads=[1, 2, 2, 2],
                  depths=[1, 1, 1, 1])
DATA = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
LAYOUT = osp.join(DATA, 'state_dict_layout_1656d82.json')
#: State-dict layouts of commit 55cda50 (SOFT's four lists, before its stage
#: modules), and the outputs of two small models with generated weights there.
LAYOUT_55CDA50 = osp.join(DATA, 'state_dict_layout_55cda50.json')


@pytest.mark.parametrize('cls,arch,option,error', [
    (SOFT, SMALL_SOFT, dict(attention='soft'),
     "unexpected keyword argument 'attention'"),
    (PlainUFOViT, TINY_UFO, dict(recompute_ffn=True),
     "unexpected keyword argument 'recompute_ffn'"),
    (PlainSOFT, SMALL_SOFT, dict(solver='cholesky'),
     "solver='cholesky' is not supported"),
    (UFOViT, dict(TINY_UFO, lpi_kernel_size=5), {},
     "arch dict has unknown keys ['lpi_kernel_size']")])
def test_options_have_one_spelling(cls, arch, option, error):
    """Spellings renamed before the first release are refused by name."""
    with pytest.raises((TypeError, ValueError), match=re.escape(error)):
        cls(arch, **option)


@pytest.mark.parametrize('cls,arch', [(SOFT, SMALL_SOFT), (UFOViT, TINY_UFO)])
def test_ffn_keys_load_as_mlp(cls, arch, tmp_path):
    source = cls(arch)
    old = {key.replace('.mlp.', '.ffn.'): value
           for key, value in source.state_dict().items()}
    assert any('.ffn.' in key for key in old)
    model = cls(arch)
    with pytest.warns(DeprecationWarning, match=r"\.ffn\.[^']*' is now '[^']*\.mlp\."):
        model.load_state_dict(old, strict=True)
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value)
    # Through init_cfg, as a config loads it.
    path = str(tmp_path / 'old.pth')
    torch.save(dict(state_dict=old), path)
    model = cls(arch, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.warns(DeprecationWarning, match=r'\.ffn\.'):
        model.init_weights()
    torch.testing.assert_close(model.state_dict(), source.state_dict())


@pytest.mark.parametrize('name,cls,kwargs', [
    ('soft++-tiny', SOFT, dict(arch='tiny', variant='soft++')),
    ('ufo-vit-tiny', UFOViT, dict(arch='tiny'))])
def test_checkpoints_of_the_previous_layout_load_strictly(name, cls, kwargs, tmp_path):
    # Keys and shapes of the backbones' state dicts before the models moved
    # into one file each (commit 1656d82).
    layout = json.load(open(LAYOUT))[name]
    generator = torch.Generator().manual_seed(0)
    state = {key: torch.randn(shape, generator=generator) if shape else
             torch.tensor(3) for key, shape in layout.items()}
    path = str(tmp_path / f'{name}.pth')
    torch.save(dict(state_dict={f'backbone.{k}': v for k, v in state.items()}), path)
    model = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=path,
                                        prefix='backbone.'))
    model.init_weights()
    loaded = model.state_dict()
    state, _ = renamed_state_dict_keys(state, model.family)
    assert set(loaded) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(loaded[key], value.to(loaded[key].dtype))


def generated_weights(layout: dict) -> dict:
    """Float64 weights for ``{key: shape}``, generated in key order as when
    ``LAYOUT_55CDA50``'s outputs were recorded."""
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in layout.items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(3)
        elif key.endswith('running_var'):
            state[key] = 0.5 + torch.rand(shape, generator=generator,
                                          dtype=torch.float64)
        else:
            state[key] = 0.1 * torch.randn(shape, generator=generator,
                                           dtype=torch.float64)
    return state


@pytest.mark.parametrize('name,cls,kwargs', [
    ('soft++-tiny', PlainSOFT, dict(variant='soft++')),
    ('soft++-tiny-classifier', PlainSOFT, dict(variant='soft++', num_classes=10)),
    ('ufo-vit-tiny', PlainUFOViT, {}),
    ('ufo-vit-tiny-classifier', PlainUFOViT,
     dict(num_classes=10, global_pool='token'))])
def test_keys_of_55cda50_are_renamed_to_the_current_layout(name, cls, kwargs):
    old = json.load(open(LAYOUT_55CDA50))[name]
    model = cls('tiny', **kwargs)
    renamed, old_keys = renamed_state_dict_keys(old, model.family)
    assert {key: tuple(shape) for key, shape in renamed.items()} == {
        key: tuple(value.shape) for key, value in model.state_dict().items()}
    # SOFT's layout changed (stage modules); UFO-ViT's did not.
    assert bool(old_keys) == (cls is PlainSOFT)


@pytest.mark.parametrize('name,cls', [('soft++-small', PlainSOFT),
                                      ('ufo-vit-small', PlainUFOViT)])
def test_a_checkpoint_saved_by_55cda50_loads_and_computes_the_same(name, cls):
    record = json.load(open(LAYOUT_55CDA50))['outputs'][name]
    kwargs = dict(variant='soft++') if cls is PlainSOFT else dict(global_pool='token')
    model = cls(record['arch'], num_classes=5, **kwargs).double().eval()
    state = generated_weights(record['keys'])
    if cls is PlainSOFT:
        with pytest.warns(DeprecationWarning, match="'patch_embeds.0.proj.0.weight' "
                          "is now 'stages.0.patch_embed.proj.0.weight'"):
            model.load_state_dict(state, strict=True)
    else:
        model.load_state_dict(state, strict=True)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    with torch.no_grad():
        maps = model.forward_intermediates(x, intermediates_only=True)
        logits = model(x)
    sums = [float(feat.sum()) for feat in maps]
    abs_sums = [float(feat.abs().sum()) for feat in maps]
    assert sums == pytest.approx(record['map_sums'], rel=1e-9, abs=1e-9)
    assert abs_sums == pytest.approx(record['map_abs_sums'], rel=1e-9)
    assert logits[0].tolist() == pytest.approx(record['logits'], rel=1e-9, abs=1e-12)


def test_old_keys_load_through_init_cfg_and_timm_filter(tmp_path):
    record = json.load(open(LAYOUT_55CDA50))['outputs']['soft++-small']
    state = generated_weights(record['keys'])
    path = str(tmp_path / 'old.pth')
    torch.save(dict(state_dict=state), path)
    model = SOFT(record['arch'], num_classes=5,
                 init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.warns(DeprecationWarning, match="'pos_embeds.0' is now "
                      "'stages.0.pos_embed'|'patch_embeds"):
        model.init_weights()
    renamed, _ = renamed_state_dict_keys(state, 'SOFT')
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value.double(), renamed[key].double())


@pytest.mark.parametrize('name,cls,kwargs', [
    ('soft++-small', PlainSOFT, dict(variant='soft++')),
    ('ufo-vit-small', PlainUFOViT, dict(global_pool='token'))])
def test_a_seed_gives_the_initial_weights_of_55cda50(name, cls, kwargs):
    """Seeded runs (the demo, the FLOP counts of seeded models) start from the
    weights they started from before SOFT's stage modules."""
    record = json.load(open(LAYOUT_55CDA50))
    # Recorded with the torch of each environment: torch's initialisers
    # changed between releases.
    version = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
    if version not in record['seeded_init_sums']:
        pytest.skip(f'no initial weights of 55cda50 recorded for torch {version}')
    torch.manual_seed(0)
    model = cls(record['outputs'][name]['arch'], num_classes=5, **kwargs)
    sums, _ = renamed_state_dict_keys(record['seeded_init_sums'][version][name],
                                      model.family)
    # A weight drawn in another order or by another initialiser changes its
    # sum entirely; torch's vectorised math (trunc_normal_'s erfinv) differs
    # between CPUs (AVX2, AVX-512) in the last bits of a float32.
    assert sums == pytest.approx({key: float(value.double().sum())
                                  for key, value in model.state_dict().items()},
                                 rel=1e-6, abs=1e-6)
