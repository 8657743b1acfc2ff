"""Reference SOFT checkpoints: conversion, loading and numerical equivalence.

The equivalence tests compare ``SOFT`` loaded with converted weights against
``official_soft_reference.py``, an independent functional re-computation of
the reference model's forward pass, on deterministic random weights in the
reference key layout.
"""
import argparse
import importlib.util
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from mmsoft.checkpoint import load_soft_checkpoint, soft_official_to_mmsoft
from mmsoft.checkpoint.soft_official import (OFFICIAL_VARIANTS, variant_hint,
                                             check_detected_arch, rename_official_key)
from mmsoft.openmmlab import SOFT
from mmsoft.models.soft import ARCH_DEFAULTS, ARCH_SETTINGS
from mmsoft.models.soft import VARIANTS
from tests.helpers import official_soft_reference as ref

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = _load_by_path('soft2mmsoft',
                    osp.join(REPO, 'tools', 'model_converters', 'soft2mmsoft.py'))
#: SOFT's named architectures, for the converter to recognise.
ARCH_TABLE = dict(arch_table=ARCH_SETTINGS, arch_defaults=ARCH_DEFAULTS)
TINY_HEADS = ARCH_SETTINGS['tiny']['num_heads']
TOLERANCE = 1e-3


@pytest.fixture(scope='module')
def official_tiny():
    """Random reference-layout weights of SOFT-tiny (10-class head)."""
    return ref.random_official_state_dict(seed=0)


@pytest.fixture(scope='module')
def official_tiny_fp64(official_tiny):
    return {k: v.double() if v.is_floating_point() else v
            for k, v in official_tiny.items()}


def converted(official):
    state_dict, _ = soft_official_to_mmsoft(official)
    return state_dict


def convert_and_check(official):
    """Converts and checks against a SOFT of the detected settings."""
    state_dict, info = soft_official_to_mmsoft(official, **ARCH_TABLE)
    settings = info['arch_settings']
    check_detected_arch(state_dict, settings, cli.soft_state_layout(settings))
    return state_dict, info


def tiny_backbone(attention, **kwargs):
    return SOFT(arch='tiny', variant=attention, solver='newton',
                max_bottleneck_tokens=None, **kwargs)


def stage_differences(model, official_fp64, attention, size, scale_scope='tensor'):
    """Max |mmsoft - reference| of each stage's output for one image."""
    gen = torch.Generator().manual_seed(size[0] + size[1])
    image = torch.randn(1, 3, *size, generator=gen)
    with torch.no_grad():
        outs = model(image)
        expected = ref.official_soft_forward(official_fp64, image.double(), TINY_HEADS,
                                             attention, scale_scope=scale_scope)
    assert [o.shape for o in outs] == [e.shape for e in expected]
    return [(o.double() - e).abs().max().item() for o, e in zip(outs, expected)]


def loaded_tiny(official, attention):
    model = tiny_backbone(attention)
    model.load_state_dict(converted(official), strict=True)
    return model.eval()


# --------------------------------------------------------------------------
# Numerical equivalence with the reference forward pass
# --------------------------------------------------------------------------
SIZES = [(224, 224), (256, 320)]


@pytest.mark.parametrize('size', SIZES)
def test_soft_matches_reference(official_tiny, official_tiny_fp64, size):
    model = loaded_tiny(official_tiny, 'soft')
    diffs = stage_differences(model, official_tiny_fp64, 'soft', size)
    print(f'soft {size}: max abs difference per stage {diffs}')
    assert max(diffs) < TOLERANCE, diffs


@pytest.mark.parametrize('size', SIZES)
def test_soft_plus_plus_matches_reference(official_tiny, official_tiny_fp64, size):
    # The reference's Newton scale spans the whole batch; at batch size 1 it
    # is mmsoft's per-image scale.
    model = loaded_tiny(official_tiny, 'soft++')
    diffs = stage_differences(model, official_tiny_fp64, 'soft++', size)
    print(f'soft++ {size}: max abs difference per stage {diffs}')
    assert max(diffs) < TOLERANCE, diffs


@pytest.mark.parametrize('size', SIZES)
def test_newton_scale_scope_matters(official_tiny, official_tiny_fp64, size):
    # A per-(image, head) scale would visibly change SOFT++'s output: the
    # equivalence above does test the scale.
    model = loaded_tiny(official_tiny, 'soft++')
    per_matrix = stage_differences(model, official_tiny_fp64, 'soft++', size,
                                   scale_scope='matrix')
    assert max(per_matrix) > 10 * TOLERANCE, per_matrix


def test_random_weights_exercise_every_term(official_tiny_fp64):
    # The bottleneck kernel must matter (else the equivalence tests would not
    # see the inverse): SOFT and SOFT++ outputs differ by O(1).
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    soft = ref.official_soft_forward(official_tiny_fp64, image.double(), TINY_HEADS,
                                     'soft')
    soft_pp = ref.official_soft_forward(official_tiny_fp64, image.double(),
                                        TINY_HEADS, 'soft++')
    for a, b in zip(soft, soft_pp):
        assert (a - b).abs().max().item() > 0.5
        assert 0.5 < a.std().item() < 2


# --------------------------------------------------------------------------
# Key conversion
# --------------------------------------------------------------------------
def test_conversion_is_one_to_one(official_tiny):
    state_dict, info = convert_and_check(official_tiny)
    model_keys = set(tiny_backbone('soft').state_dict())
    assert set(state_dict) == model_keys
    assert len(state_dict) == len(official_tiny) - 2 == info['num_tensors'] == 185
    assert info['dropped'] == ['head.bias', 'head.weight']
    assert info['arch'] == 'tiny' and info['pretrain_img_size'] == 224
    assert info['variant'] is None and info['wrapper'] is None
    for key, value in official_tiny.items():
        if not key.startswith('head.'):
            assert state_dict[rename_official_key(key)] is value


@pytest.mark.parametrize('key, expected', [
    ('patch_embed1.proj.7.running_var', 'stages.0.patch_embed.proj.7.running_var'),
    ('patch_embed4.proj.1.num_batches_tracked',
     'stages.3.patch_embed.proj.1.num_batches_tracked'),
    ('pos_embed4', 'stages.3.pos_embed'),
    ('block1.0.att.mha.W_q.weight', 'stages.0.blocks.0.attn.q_proj.weight'),
    ('block2.1.att.mha.W_v.bias', 'stages.1.blocks.1.attn.v_proj.bias'),
    ('block3.2.att.mha.attn.Qlandmark_op.weight',
     'stages.2.blocks.2.attn.bottleneck_conv.weight'),
    ('block3.0.att.mha.attn.Qnorm_act.0.bias',
     'stages.2.blocks.0.attn.bottleneck_norm.bias'),
    ('block1.0.att.mha.attn.conv.weight', 'stages.0.blocks.0.attn.local_conv.weight'),
    ('block1.0.att.mha.ff.weight', 'stages.0.blocks.0.attn.out_proj.weight'),
    ('block2.0.att.ff1.weight', 'stages.1.blocks.0.mlp.fc1.weight'),
    ('block2.0.att.norm2.bias', 'stages.1.blocks.0.norm2.bias'),
    ('block4.1.attn.kv.weight', 'stages.3.blocks.1.attn.kv.weight'),
    ('block4.0.mlp.fc2.bias', 'stages.3.blocks.0.mlp.fc2.bias'),
    ('norm.weight', 'stages.3.norm.weight'),
    ('cls_token', 'stages.3.cls_token'),
    ('patch_embed1.proj.2.weight', None),  # ReLU slot: no parameters
    ('patch_embed2.proj.3.weight', None),
    ('block4.0.att.mha.W_q.weight', None),
    ('block1.0.attn.q.weight', None),
])
def test_rename_rules(key, expected):
    assert rename_official_key(key) == expected


def test_refuses_foreign_keys(official_tiny):
    foreign = dict(official_tiny)
    foreign['neck.conv.weight'] = torch.zeros(1)
    foreign['block1.0.att.mha.attn.extra.weight'] = torch.zeros(1)
    with pytest.raises(ValueError) as err:
        soft_official_to_mmsoft(foreign)
    message = str(err.value)
    assert '2 checkpoint entries' in message
    assert 'neck.conv.weight' in message
    assert 'block1.0.att.mha.attn.extra.weight' in message


def test_refuses_missing_and_inconsistent_tensors(official_tiny):
    incomplete = dict(official_tiny)
    del incomplete['block2.1.att.norm1.weight']
    with pytest.raises(ValueError, match=r'does not fit the detected architecture'
                       r'.*: missing keys: stages\.1\.blocks\.1\.norm1\.weight\.'):
        convert_and_check(incomplete)
    wrong = dict(official_tiny)
    wrong['block3.1.att.mha.W_v.weight'] = torch.zeros(320, 64)
    with pytest.raises(ValueError, match=r'stages\.2\.blocks\.1\.attn\.v_proj\.weight: '
                       r'\(320, 64\) \(expected \(320, 320\)\)'):
        convert_and_check(wrong)


def test_refuses_mmsoft_layout_with_hint(official_tiny):
    with pytest.raises(ValueError, match='convert_weights=False'):
        soft_official_to_mmsoft(converted(official_tiny))


@pytest.mark.parametrize('wrap', ['model', 'state_dict', 'backbone', 'module',
                                  'module+backbone'])
def test_unwraps_and_strips_prefixes(official_tiny, wrap):
    reference = converted(official_tiny)
    if wrap in ('model', 'state_dict'):
        checkpoint = {wrap: dict(official_tiny), 'epoch': 300}
    else:
        prefix = ''.join(p + '.' for p in wrap.split('+'))
        checkpoint = {'state_dict': {prefix + k: v for k, v in official_tiny.items()}}
    state_dict, info = soft_official_to_mmsoft(checkpoint)
    assert state_dict.keys() == reference.keys()
    assert all(state_dict[k] is reference[k] for k in reference)
    assert info['wrapper'] == (wrap if wrap == 'model' else 'state_dict')
    assert len(info['dropped']) == 2 and all('head.' in k for k in info['dropped'])


@pytest.mark.parametrize('arch', list(ARCH_SETTINGS))
def test_detects_every_arch(arch):
    settings = ARCH_SETTINGS[arch]
    official = ref.random_official_state_dict(
        embed_dims=settings['embed_dims'], num_heads=settings['num_heads'],
        depths=settings['depths'], empty=True)
    _, info = soft_official_to_mmsoft(official, **ARCH_TABLE)
    assert info['arch'] == arch
    assert info['arch_settings']['num_heads'] == settings['num_heads']
    assert info['arch_settings']['depths'] == settings['depths']


def test_unnamed_arch_is_reported():
    official = ref.random_official_state_dict(depths=(1, 1, 1, 1), empty=True)
    _, info = convert_and_check(official)
    assert info['arch'] is None
    assert info['arch_settings']['depths'] == [1, 1, 1, 1]
    assert info['arch_settings']['num_heads'] == [2, 4, 10, None]


def test_detected_settings_rebuild_the_backbone(official_tiny):
    # The layout the conversion is checked against is that of SOFT-tiny.
    _, info = soft_official_to_mmsoft(official_tiny)
    layout = cli.soft_state_layout(info['arch_settings'])
    model_shapes = {k: v.shape for k, v in SOFT(arch='tiny').state_dict().items()}
    assert {k: v.shape for k, v in layout.items()} == model_shapes


# --------------------------------------------------------------------------
# Attention variant
# --------------------------------------------------------------------------
@pytest.mark.parametrize('text, expected', [
    ('soft_norm_tiny', 'soft++'), ('soft_tiny', 'soft'),
    ('SOFT_Large_norm.pth', 'soft++'), ('SOFT_Tiny.pth', 'soft'),
    ('softmaxfreenormvisiontransformer', 'soft++'),
    ('softmaxfreevisiontransformer', 'soft'), ('checkpoint.pth', None), (None, None),
])
def test_variant_hint(text, expected):
    assert variant_hint(text) == expected


def test_reference_variants_are_the_backbone_variants():
    assert OFFICIAL_VARIANTS == VARIANTS


def test_attention_decision_order(official_tiny):
    timm_norm = {'state_dict': official_tiny, 'arch': 'soft_norm_tiny',
                 'args': argparse.Namespace(model='soft_norm_tiny')}
    timm_plain = {'state_dict': official_tiny,
                  'args': argparse.Namespace(model='soft_small')}
    cases = [
        (dict(checkpoint=timm_norm), ('soft++', 'checkpoint metadata')),
        (dict(checkpoint=timm_plain, name_hint='x_norm.pth'),
         ('soft', 'checkpoint metadata')),
        (dict(checkpoint=official_tiny, name_hint='/a/SOFT_Tiny_norm.pth'),
         ('soft++', 'file name')),
        (dict(checkpoint=official_tiny, name_hint='SOFT_Tiny.pth'),
         ('soft', 'file name')),
        (dict(checkpoint=official_tiny, name_hint='best.pth'), (None, None)),
        (dict(checkpoint=timm_norm, variant='soft'), ('soft', 'argument')),
    ]
    for kwargs, expected in cases:
        _, info = soft_official_to_mmsoft(**kwargs)
        assert (info['variant'], info['variant_source']) == expected, kwargs
    _, info = soft_official_to_mmsoft(timm_norm, variant='soft')
    assert info['variant_detected'] == 'soft++'
    with pytest.raises(ValueError, match='variant='):
        soft_official_to_mmsoft(official_tiny, variant='norm')


# --------------------------------------------------------------------------
# Loading through init_cfg and the command-line converter
# --------------------------------------------------------------------------
def assert_same_weights(model, state_dict):
    for key, value in model.state_dict().items():
        assert torch.equal(value, state_dict[key]), key


def test_init_cfg_converts_reference_checkpoint(official_tiny, tmp_path):
    # A timm training checkpoint: arguments stored as an argparse.Namespace.
    path = tmp_path / 'SOFT_Tiny_norm.pth'
    torch.save({'state_dict': official_tiny, 'arch': 'soft_norm_tiny', 'epoch': 299,
                'args': argparse.Namespace(model='soft_norm_tiny', lr=1e-3)}, path)
    model = SOFT(arch='tiny', convert_weights=True,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert_same_weights(model, converted(official_tiny))


def test_cli_converts_and_output_loads(official_tiny, official_tiny_fp64, tmp_path,
                                       capsys):
    src = tmp_path / 'checkpoint.pth'
    torch.save({'model': {f'module.{k}': v for k, v in official_tiny.items()}}, src)
    dst = tmp_path / 'out' / 'soft_tiny_mmsoft.pth'

    assert cli.main([str(src), str(dst)]) == 1  # variant undecidable
    assert '--variant' in capsys.readouterr().err
    assert not dst.exists()

    assert cli.main([str(src), str(dst), '--variant', 'soft++']) == 0
    printed = capsys.readouterr().out
    assert 'tiny' in printed and 'soft++ (from argument)' in printed
    assert '185 converted' in printed and 'head.weight' in printed
    saved = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    assert saved['meta']['arch'] == 'tiny' and saved['meta']['variant'] == 'soft++'
    assert saved['meta']['pretrain_img_size'] == 224

    # A bare SOFT (default arguments) loads the converted file.
    bare = SOFT(init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    bare.init_weights()
    assert_same_weights(bare, converted(official_tiny))
    bare = SOFT(max_bottleneck_tokens=None,
                init_cfg=dict(type='Pretrained', checkpoint=str(dst))).eval()
    bare.init_weights()
    diffs = stage_differences(bare, official_tiny_fp64, 'soft++', (224, 224))
    assert max(diffs) < TOLERANCE


def test_cli_refuses_foreign_checkpoint(tmp_path, capsys):
    src = tmp_path / 'other.pth'
    torch.save({'conv.weight': torch.zeros(2), 'fc.bias': torch.zeros(1)}, src)
    assert cli.main([str(src), str(tmp_path / 'x.pth'), '--variant', 'soft']) == 1
    err = capsys.readouterr().err
    assert 'conv.weight' in err and 'fc.bias' in err


def test_init_cfg_prefix_selects_backbone(official_tiny, tmp_path):
    weights = converted(official_tiny)
    path = tmp_path / 'detector.pth'
    torch.save({'state_dict': {**{f'backbone.{k}': v for k, v in weights.items()},
                               'neck.conv.weight': torch.zeros(3)}}, path)
    model = SOFT(init_cfg=dict(type='Pretrained', checkpoint=str(path),
                               prefix='backbone.'))
    model.init_weights()
    assert_same_weights(model, weights)
    # Without the prefix, the neck's entry is an unexpected key.
    model = SOFT(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError, match=r'unexpected keys: neck\.conv\.weight'):
        model.init_weights()


def test_frozen_stages_apply_after_loading(official_tiny, tmp_path):
    path = tmp_path / 'soft_tiny.pth'
    torch.save({'state_dict': converted(official_tiny)}, path)
    model = SOFT(frozen_stages=1,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert not model.stages[0].pos_embed.requires_grad
    assert not any(p.requires_grad for p in model.stages[0].patch_embed.parameters())
    assert model.stages[1].pos_embed.requires_grad


def test_pos_embed_trained_at_384_is_resized(tmp_path):
    official = ref.random_official_state_dict(pos_grid=96, seed=3)
    path = tmp_path / 'SOFT_Tiny_384.pth'
    torch.save(official, path)
    _, info = soft_official_to_mmsoft(official)
    assert info['pretrain_img_size'] == 384

    model = SOFT(arch='tiny', convert_weights=True,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for i, grid in enumerate([56, 28, 14, 7]):
        src = official[f'pos_embed{i + 1}']
        tokens = src[:, 1:] if i == 3 else src
        side = 96 // 2**i
        image = tokens.reshape(1, side, side, -1).permute(0, 3, 1, 2)
        expected = F.interpolate(image, size=(grid, grid), mode='bilinear',
                                 align_corners=False).flatten(2).transpose(1, 2)
        if i == 3:
            expected = torch.cat((src[:, :1], expected), dim=1)
        assert model.stages[i].pos_embed.shape == expected.shape
        torch.testing.assert_close(model.stages[i].pos_embed.data, expected)
    assert torch.equal(model.stages[3].pos_embed[:, 0], official['pos_embed4'][:, 0])
    assert torch.equal(model.stages[2].blocks[1].attn.q_proj.weight,
                       official['block3.1.att.mha.W_q.weight'])

    # Built for 384, nothing is resized.
    model = SOFT(arch='tiny', convert_weights=True, pretrain_img_size=384,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for i in range(4):
        assert torch.equal(model.stages[i].pos_embed, official[f'pos_embed{i + 1}'])


def test_shape_mismatch_names_key_and_shapes(official_tiny, tmp_path):
    weights = dict(converted(official_tiny))
    weights['stages.1.blocks.0.attn.q_proj.weight'] = torch.zeros(128, 64)
    path = tmp_path / 'bad.pth'
    torch.save({'state_dict': weights}, path)
    model = SOFT(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError, match=r'stages\.1\.blocks\.0\.attn\.q_proj\.weight: '
                       r'\(128, 64\) \(expected \(128, 128\)\)'):
        model.init_weights()

    # Another arch: every differing tensor is named.
    path = tmp_path / 'tiny.pth'
    torch.save({'state_dict': converted(official_tiny)}, path)
    model = SOFT(arch=dict(ARCH_SETTINGS['tiny'], embed_dims=[64, 128, 288, 512],
                           num_heads=[2, 4, 9, 16]),
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError) as err:
        model.init_weights()
    assert 'stages.2.blocks.0.attn.q_proj.weight: (320, 320) (expected (288, 288))' \
        in str(err.value)


def test_pos_embed_of_other_width_is_a_mismatch(official_tiny, tmp_path):
    weights = dict(converted(official_tiny))
    weights['stages.1.pos_embed'] = torch.zeros(1, 784, 96)
    path = tmp_path / 'bad_pos.pth'
    torch.save(weights, path)
    model = SOFT(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError, match=r'stages\.1\.pos_embed: \(1, 784, 96\) '
                       r'\(expected \(1, 784, 128\)\).*resized only from a square '
                       r'grid of the same width'):
        model.init_weights()


def test_missing_and_unexpected_keys_are_listed(official_tiny, tmp_path):
    weights = dict(converted(official_tiny))
    del weights['stages.3.blocks.1.mlp.fc1.bias']
    del weights['stages.0.patch_embed.proj.1.num_batches_tracked']  # tolerated
    weights['stages.0.blocks.0.attn.extra'] = torch.zeros(1)
    path = tmp_path / 'partial.pth'
    torch.save({'state_dict': weights}, path)
    model = SOFT()
    with pytest.raises(ValueError) as err:
        load_soft_checkpoint(model, str(path))
    message = str(err.value)
    assert 'unexpected keys: stages.0.blocks.0.attn.extra' in message
    assert 'missing keys: stages.3.blocks.1.mlp.fc1.bias' in message
    assert 'num_batches_tracked' not in message

    del weights['stages.0.blocks.0.attn.extra']
    weights['stages.3.blocks.1.mlp.fc1.bias'] = torch.ones(2048)
    torch.save({'state_dict': weights}, path)
    load_soft_checkpoint(model, str(path))
    assert torch.equal(model.stages[3].blocks[1].mlp.fc1.bias, torch.ones(2048))


def test_convert_weights_on_mmsoft_file_is_refused(official_tiny, tmp_path):
    path = tmp_path / 'mmsoft.pth'
    torch.save({'state_dict': converted(official_tiny)}, path)
    model = SOFT(convert_weights=True, init_cfg=dict(type='Pretrained',
                                                     checkpoint=str(path)))
    with pytest.raises(ValueError, match='convert_weights=False'):
        model.init_weights()


# --------------------------------------------------------------------------
# The configs compute the function of the official checkpoints
# --------------------------------------------------------------------------
CONFIG_PARITY = {
    'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py': 'tiny',
    'configs/soft/upernet_soft++-small_8xb2-160k_ade20k-512x512.py': 'small',
}


def config_backbone_with_official_weights(config, official, tmp_path, **overrides):
    """The config's backbone, loading the official-layout ``official``
    through its own ``init_cfg`` (converted on the fly)."""
    from mmengine.config import Config
    from mmengine.registry import MODELS
    path = tmp_path / 'soft_norm_official.pth'
    torch.save(official, path)
    cfg = Config.fromfile(osp.join(REPO, config)).model.backbone
    cfg.update(convert_weights=True, drop_path_rate=0., **overrides)
    cfg.init_cfg.checkpoint = str(path)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


@pytest.mark.parametrize('config, arch', sorted(CONFIG_PARITY.items()))
@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_configs_reproduce_the_official_function(config, arch, tmp_path):
    settings = ARCH_SETTINGS[arch]
    official = ref.random_official_state_dict(
        embed_dims=settings['embed_dims'], num_heads=settings['num_heads'],
        depths=settings['depths'], seed=1)
    official_fp64 = {k: v.double() if v.is_floating_point() else v
                     for k, v in official.items()}
    model = config_backbone_with_official_weights(config, official, tmp_path)
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        outs = model(image)
    expected = ref.official_soft_forward(official_fp64, image.double(),
                                         settings['num_heads'], 'soft++')
    diffs = [(o.double() - e).abs().max().item() for o, e in zip(outs, expected)]
    print(f'{config} at 224x224: max abs difference per stage {diffs}')
    assert max(diffs) < TOLERANCE, diffs


@pytest.mark.mmcv_ops  # mmdet's registry imports mmdet.models (mmcv._ext)
def test_exact_solver_is_another_function_where_newton_has_not_converged(
        official_tiny, official_tiny_fp64, tmp_path):
    # The same loaded weights under the exact pseudo-inverse, at 256x320:
    # the difference from the reference is far beyond the tolerance the
    # configs' solver meets, so the test above does tell solvers apart.
    config = 'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py'
    image = torch.randn(1, 3, 256, 320, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = ref.official_soft_forward(official_tiny_fp64, image.double(),
                                             TINY_HEADS, 'soft++')
        diffs = {}
        for solver in ('newton_closed_form', 'exact'):
            model = config_backbone_with_official_weights(config, official_tiny,
                                                          tmp_path, solver=solver)
            diffs[solver] = max((o.double() - e).abs().max().item()
                                for o, e in zip(model(image), expected))
    print(f'max abs difference from the reference at 256x320: {diffs}')
    assert diffs['newton_closed_form'] < TOLERANCE
    assert diffs['exact'] > 10 * TOLERANCE
