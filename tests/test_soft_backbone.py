"""The SOFT backbone: shapes, parameters, conventions and bad input."""
import math
import os.path as osp

import pytest
import torch

from mmsoft.openmmlab import SOFT
from mmsoft.models.soft import ARCH_SETTINGS

HERE = osp.dirname(osp.abspath(__file__))
BACKBONES_DOC = osp.join(osp.dirname(HERE), 'docs', 'backbones.md')
# Keys and shapes of the reference models' state dicts.
from tests.helpers.official_soft_reference import (  # noqa: E402
    random_official_state_dict)
# Tensors of the reference models that are not backbone parameters.
OFFICIAL_BUFFER_SUFFIXES = ('.running_mean', '.running_var', '.num_batches_tracked')

# Backbone parameters (classifier excluded) in millions, as docs/backbones.md's
# table shows them; the reference counts with the 1000-class head are 0.51M
# higher.
PARAMS_M = {'tiny': 12.56, 'small': 38.35, 'medium': 45.30,
            'large': 64.19, 'huge': 86.60}
SIZES = [(33, 47), (97, 131), (64, 64)]


def tiny_arch(depths=(1, 1, 1, 1)):
    return dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                depths=list(depths))


def official_backbone_parameters(arch: str) -> int:
    """Learnable elements of the reference model of ``arch``, classifier excluded.

    Counts the tensors of the reference key layout for the arch's widths,
    heads and depths, less the classifier (``head.*``) and the BatchNorm
    running statistics, which are buffers, not parameters.
    """
    settings = ARCH_SETTINGS[arch]
    state_dict = random_official_state_dict(
        settings['embed_dims'], settings['num_heads'], settings['depths'],
        empty=True)
    return sum(tensor.numel() for key, tensor in state_dict.items()
               if not key.startswith('head.')
               and not key.endswith(OFFICIAL_BUFFER_SUFFIXES))


@pytest.mark.parametrize('arch', list(ARCH_SETTINGS))
def test_parameter_count(arch):
    expected = official_backbone_parameters(arch)
    model = SOFT(arch=arch)
    count = sum(p.numel() for p in model.parameters())
    assert count == expected
    assert count / 1e6 == pytest.approx(PARAMS_M[arch], abs=0.005)


def test_docs_table_shows_each_arch():
    with open(BACKBONES_DOC, encoding='utf-8') as f:
        readme = f.read()
    for arch, settings in ARCH_SETTINGS.items():
        cells = [arch] + [', '.join(map(str, settings[key]))
                          for key in ('embed_dims', 'num_heads', 'depths')]
        row = '| ' + ' | '.join(cells) + f' | {PARAMS_M[arch]:.2f}M |'
        assert row in readme, f'docs/backbones.md lacks the SOFT table row {row!r}'


@pytest.mark.parametrize('arch', list(ARCH_SETTINGS))
def test_output_shapes_every_arch(arch):
    # Shallow copies of each arch (one block per stage) keep this fast; the
    # widths, heads and stems are those of the arch.
    settings = dict(ARCH_SETTINGS[arch], depths=[1, 1, 1, 1])
    model = SOFT(arch=settings, solver='exact').eval()
    for height, width in SIZES:
        with torch.no_grad():
            outs = model(torch.randn(1, 3, height, width))
        for i, out in enumerate(outs):
            stride = 2**(i + 2)
            assert out.shape == (1, settings['embed_dims'][i],
                                 math.ceil(height / stride), math.ceil(width / stride))


def test_detection_resolution_and_out_indices():
    model = SOFT(arch=tiny_arch(), out_indices=(1, 3), solver='exact').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 800, 1333))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 100, 167), (1, 128, 25, 42)]


def outputs_under_two_solvers(solvers, size, **kwargs):
    """Stage outputs of one initialisation of a small SOFT under each of two
    solvers, on one random batch of two images of ``size``."""
    torch.manual_seed(0)
    models = [SOFT(arch=tiny_arch(), solver=solver, **kwargs) for solver in solvers]
    models[0].init_weights()
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        return [model.eval()(x) for model in models]


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_solvers_agree_on_backbone(variant):
    newton, exact = outputs_under_two_solvers(
        ('newton', 'exact'), (96, 96), variant=variant, max_bottleneck_tokens=None)
    for a, b in zip(newton, exact):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('cap', [None, 16])
def test_closed_form_solver_equals_newton_on_backbone(variant, cap):
    """At 128x192 the bottleneck grids are 4x6 (24 tokens), pooled to 3x4
    with the cap of 16."""
    newton, closed = outputs_under_two_solvers(
        ('newton', 'newton_closed_form'), (128, 192), variant=variant,
        max_bottleneck_tokens=cap)
    for a, b in zip(newton, closed):
        assert float((a - b).norm() / a.norm()) < 1e-5


@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
def test_batch_mates_do_not_change_features(solver):
    torch.manual_seed(0)
    model = SOFT(arch=tiny_arch(), solver=solver).eval()
    model.init_weights()
    image = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        alone = model(image)
        together = model(torch.cat((image, 10 * torch.randn(1, 3, 64, 64))))
    for a, b in zip(alone, together):
        torch.testing.assert_close(a, b[:1], atol=1e-5, rtol=1e-4)


def test_position_embeddings_follow_input_size():
    model = SOFT(arch=tiny_arch())
    assert model.stages[0].pos_embed.shape == (1, 56 * 56, 32)
    assert model.stages[3].pos_embed.shape == (1, 7 * 7 + 1, 128)
    resized = model.stages[3].position_embeddings((5, 9))
    assert resized.shape == (1, 1 + 45, 128)
    torch.testing.assert_close(resized[:, 0], model.stages[3].pos_embed[:, 0])
    torch.testing.assert_close(model.stages[0].position_embeddings((56, 56)),
                               model.stages[0].pos_embed)


def test_frozen_stages_and_norm_eval():
    model = SOFT(arch=tiny_arch(), frozen_stages=2, norm_eval=True)
    model.train()
    frozen = [model.stages[0], model.stages[1]]  # stem and stage 1: stages 0, 1
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert not model.stages[1].pos_embed.requires_grad
    assert not model.stages[1].training
    assert all(p.requires_grad for p in model.stages[2].parameters())
    assert not model.stages[2].patch_embed.proj[1].training  # BN kept in eval
    assert model.stages[2].training


def test_with_cp_gives_same_gradients():
    torch.manual_seed(0)
    plain = SOFT(arch=tiny_arch(), drop_path_rate=0.)
    plain.init_weights()
    checkpointed = SOFT(arch=tiny_arch(), drop_path_rate=0., with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 64, 64)
    grads = []
    for model in (plain, checkpointed):
        model.train()
        sum(o.sum() for o in model(x.clone().requires_grad_())).backward()
        grads.append(model.stages[0].blocks[0].attn.q_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_gradients_reach_every_stage():
    model = SOFT(arch=tiny_arch(), solver='newton')
    model.init_weights()
    model.train()
    sum(o.mean() for o in model(torch.randn(2, 3, 64, 64))).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
    assert model.stages[0].blocks[0].attn.bottleneck_conv.weight.grad.abs().sum() > 0


@pytest.mark.mmcv_ops  # imports mmdet.models/mmseg.models
def test_registered_in_root_registry():
    from mmengine.registry import MODELS
    model = MODELS.build(dict(type='SOFT', arch=tiny_arch()))
    assert isinstance(model, SOFT)


@pytest.mark.parametrize('kwargs,message', [
    (dict(arch='giant'), "arch='giant' is not supported"),
    (dict(arch=dict(embed_dims=[64, 128, 320, 512])), 'lacks the keys'),
    (dict(arch=dict(tiny_arch(), num_heads=[3, 2, 3, 4])),
     r'embed_dims\[0\]=32 is not divisible by num_heads\[0\]=3'),
    (dict(variant='softmax'), "variant='softmax' is not supported"),
    (dict(solver='lu'), "solver='lu' is not supported"),
    (dict(out_indices=(0, 4)), r'out_indices=\(0, 4\) is invalid'),
    (dict(frozen_stages=5), 'frozen_stages=5 is out of range'),
    (dict(max_bottleneck_tokens=0), 'max_bottleneck_tokens=0 is invalid'),
    (dict(drop_path_rate=1.5), 'drop_path_rate=1.5 is invalid'),
])
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SOFT(**kwargs)


def test_bad_inputs_raise():
    model = SOFT(arch=tiny_arch())
    with pytest.raises(ValueError, match='1 channels but the backbone was built '
                       'with in_channels=3'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='input of size 31x64 is too small'):
        model(torch.randn(1, 3, 31, 64))
    with pytest.raises(ValueError, match='4-D tensor'):
        model(torch.randn(3, 64, 64))
