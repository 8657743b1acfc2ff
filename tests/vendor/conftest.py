"""Peers' own test files on mmsoft's names: timm's model tests, transformers'
backbone tests and segmentation-models-pytorch's encoder and model tests.

Each peer's tests run on every mmsoft name they are collected for, but for
the entries of its lists below, each a test's name and why
(:mod:`tests.vendor.peer_tests`). A test dropped otherwise fails the run.
Where a peer's package is missing (the floor environment) its files are not
collected.
"""
import importlib.util
import os.path as osp

import pytest

from .peer_tests import TINY_NAMES, Peer, PeerSelection

HERE = osp.dirname(osp.abspath(__file__))


def _has(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


HAS_TIMM = _has('timm')
HAS_TRANSFORMERS = HAS_TIMM and _has('transformers')
HAS_SMP = HAS_TIMM and _has('segmentation_models_pytorch')
# The peers' vendored trees are imported by mmsoft's subclasses, not collected.
collect_ignore = ['transformers/tests', 'smp/tests']
collect_ignore += [] if HAS_TIMM else ['timm']
collect_ignore += [] if HAS_TRANSFORMERS else ['transformers']
collect_ignore += [] if HAS_SMP else ['smp']

if HAS_TIMM:
    import mmsoft.timm_models  # registers the names before test_models.py lists them
    NAMES = tuple(sorted(mmsoft.timm_models.default_cfgs))
else:
    NAMES = ()

TIMM = Peer(
    directory=osp.join(HERE, 'timm'), files=('test_models.py', ), names=NAMES,
    # mmsoft's models are in NON_STD_FILTERS and their module in FEAT_INTER_FILTERS;
    # where GITHUB_ACTIONS is set, timm's EXCLUDE_FILTERS leaves *huge* out.
    required=('test_model_forward', 'test_model_backward',
              'test_model_default_cfgs_non_std', 'test_model_forward_intermediates',
              'test_model_forward_intermediates_features'),
    tiny_only={
        'test_prune_intermediate_layers_contract':
            'prunes at each of the 4 outputs and trains each pruned copy, the slowest '
            'test of a tiny model; the larger sizes stack the same stages',
        'test_model_forward_fx':
            'a trace of each larger size adds seconds; its leaves (SoftStage, '
            'UFOBlock, ...) are the tiny sizes\' classes',
        'test_model_backward_fx':
            'as test_model_forward_fx',
        'test_features_only_grad_checkpointing_backward':
            'added for the tiny names (README.md); every size checkpoints in '
            'test_model_forward',
    })

TRANSFORMERS = Peer(
    directory=osp.join(HERE, 'transformers'),
    files=('tests/test_backbone_common.py',
           'tests/models/timm_backbone/test_modeling_timm_backbone.py'),
    names=TINY_NAMES,
    required=('test_backbone_stage_selection', 'test_create_from_modified_config',
              'test_load_timm_backbone_from_config'),
    dropped={
        'test_config':
            'runs ConfigTester (tests/test_configuration_common.py), not vendored: it '
            'imports tests/utils/, which the 5.25.0 sdist does not ship; it checks '
            'TimmBackboneConfig alone',
        'test_batching_equivalence':
            'runs ModelTesterMixin\'s test (tests/test_modeling_common.py), not '
            'vendored: it imports tests/generation/ and tests/exporters/, which the '
            '5.25.0 sdist does not ship',
        'test_retain_grad_hidden_states_attentions':
            'calls ModelTesterMixin\'s _prepare_for_class, not vendored (as '
            'test_batching_equivalence)',
    },
    skipped={
        'test_timm_transformer_backbone_equivalence':
            'needs the Hub: loads resnet18 and microsoft/resnet-18 pretrained',
        'test_load_timm_backbone_from_checkpoint':
            'needs the Hub: a backbone name without backbone_config makes '
            'transformers 5.x ask the Hub for the repo resnet18',
        'test_load_timm_backbone_with_kwargs':
            'needs the Hub: as test_load_timm_backbone_from_checkpoint',
    },
    xfailed={
        'test_backbone_outputs': (
            IndexError,
            'output_hidden_states=True: TimmBackbone widens the return_layers of '
            'timm\'s hook wrappers to every stage; timm\'s forward_intermediates '
            'wrapper (FeatureGetterNet, mmsoft\'s) has none, so hidden_states holds '
            'the out_indices maps only (huggingface/transformers#30307)'),
    })

SMP = Peer(
    directory=osp.join(HERE, 'smp'),
    files=('tests/encoders/base.py', 'tests/models/base.py'),
    names=('soft_plus_plus_tiny', 'ufo_vit_tiny'),
    required=('test_in_channels', 'test_depth', 'test_dilated', 'test_compile',
              'test_torch_export', 'test_torch_script', 'test_save_load_with_hub_mixin',
              'test_any_resolution', 'test_classification_head'),
    dropped={
        'tests/models/base.py::test_compile':
            'on the encoders only (tests/encoders/base.py): UPerNet\'s compiles the '
            'same encoder inside smp\'s decoder, seconds more a name',
        'tests/models/base.py::test_torch_export':
            'on the encoders only, as test_compile',
    },
    skipped={
        'test_preserve_forward_output':
            'needs the Hub: smp-test-models\' checkpoints (and RUN_SLOW)',
    })

PEERS = [peer for peer, present in ((TIMM, HAS_TIMM), (TRANSFORMERS, HAS_TRANSFORMERS),
                                    (SMP, HAS_SMP)) if present]


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin('mmsoft-peer-tests'):
        config.pluginmanager.register(PeerSelection(PEERS), 'mmsoft-peer-tests')
