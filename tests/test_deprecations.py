"""Renamed options and state-dict keys keep working, with a
``DeprecationWarning`` naming the new spelling; checkpoints of earlier
versions load strictly."""
import json
import os.path as osp
import warnings

import pytest
import torch

from mmsoft.models import SOFT as PlainSOFT
from mmsoft.models import UFOViT as PlainUFOViT
from mmsoft.openmmlab import SOFT, UFOViT

TINY_UFO = dict(embed_dims=32, depth=4, num_heads=2)
SMALL_SOFT = dict(embed_dims=[16, 32, 64, 64], num_heads=[1, 2, 2, 2],
                  depths=[1, 1, 1, 1])
LAYOUT = osp.join(osp.dirname(osp.abspath(__file__)), 'data',
                  'state_dict_layout_1656d82.json')


@pytest.mark.parametrize('cls', [SOFT, PlainSOFT])
def test_attention_is_variant(cls):
    with pytest.warns(DeprecationWarning, match=r'attention=.*now spelled variant='):
        model = cls(SMALL_SOFT, attention='soft')
    assert model.variant == 'soft'
    with pytest.raises(TypeError, match='attention= and variant='):
        cls(SMALL_SOFT, attention='soft', variant='soft++')


@pytest.mark.parametrize('cls,arch', [(SOFT, SMALL_SOFT), (UFOViT, TINY_UFO),
                                      (PlainUFOViT, TINY_UFO)])
def test_recompute_ffn_is_recompute_mlp(cls, arch):
    with pytest.warns(DeprecationWarning, match='now spelled recompute_mlp='):
        model = cls(arch, recompute_ffn=True)
    mlps = [m for m in model.modules() if type(m).__name__ == 'MLP']
    assert mlps and not any(m.keep_hidden for m in mlps)


def test_lpi_kernel_size_is_local_kernel_size():
    renamed = "'lpi_kernel_size'.*'local_kernel_size'"
    with pytest.warns(DeprecationWarning, match=renamed):
        model = UFOViT(dict(TINY_UFO, lpi_kernel_size=5))
    assert model.blocks[0].lpi.conv1.kernel_size == (5, 5)
    with pytest.raises(ValueError, match="'lpi_kernel_size' and 'local_kernel_size'"):
        UFOViT(dict(TINY_UFO, lpi_kernel_size=5, local_kernel_size=3))


def test_the_warning_names_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        SOFT(SMALL_SOFT, attention='soft')
    assert [osp.basename(w.filename) for w in caught
            if w.category is DeprecationWarning] == ['test_deprecations.py']


@pytest.mark.parametrize('cls,arch', [(SOFT, SMALL_SOFT), (UFOViT, TINY_UFO)])
def test_ffn_keys_load_as_mlp(cls, arch, tmp_path):
    source = cls(arch)
    old = {key.replace('.mlp.', '.ffn.'): value
           for key, value in source.state_dict().items()}
    assert any('.ffn.' in key for key in old)
    model = cls(arch)
    with pytest.warns(DeprecationWarning, match=r'\.ffn\. are now \.mlp\.'):
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
    assert set(loaded) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(loaded[key], value.to(loaded[key].dtype))
