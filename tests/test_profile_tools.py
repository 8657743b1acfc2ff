"""The per-operator profile (tools/analysis/profile_backbone.py) and the
interleaved A/B runs (tools/analysis/ab_compare.py): their counts, their
regions and their output."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / 'tools' / 'analysis'))

from mmsoft_analysis import worker_env  # noqa: E402
from mmsoft_analysis.op_profile import (FUNCTION_REGIONS, attribute,  # noqa: E402
                                        check_function_regions, operator_class,
                                        profile_regions, profile_step)

from ab_compare import parse_variant  # noqa: E402


def test_every_function_region_names_a_function():
    """A renamed function fails here, not silently in the profile."""
    check_function_regions()
    assert 'mmsoft.models.soft.kernel_inverse' in FUNCTION_REGIONS


def test_operator_classes():
    assert operator_class('aten::addmm') == 'matrix products'
    assert operator_class('aten::convolution_backward') == 'convolutions'
    assert operator_class('aten::_linalg_eigh') == 'linear algebra'
    assert operator_class('aten::copy_') == 'layout copies'
    assert operator_class('aten::exp_') == 'elementwise math'
    assert operator_class('ChunkedKernelProduct') == 'Python and dispatch'


class Mlp(nn.Sequential):
    """Named as timm's MLP: the region 'MLP'."""


class TwoLinears(nn.Module):
    """An MLP: its FLOPs are known by hand."""

    def __init__(self):
        super().__init__()
        self.mlp = Mlp(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x):
        return [self.mlp(x)[..., None, None]]  # one (B, 8, 1, 1) "map"


@pytest.mark.parametrize('mode, passes', [('inference', 1), ('train', 3)])
def test_flops_of_matrix_products(mode, passes):
    """Forward: 2 N (16 x 32 + 32 x 8); a training step adds the two products
    of each Linear's backward (the first Linear's input gradient is not needed)."""
    model = TwoLinears()
    x = torch.randn(10, 16)
    profile = profile_step(model, x, mode, repeats=1, warmup=0)
    flops = sum(entry['flops'] for entry in profile['classes'].values())
    forward = 2 * 10 * (16 * 32 + 32 * 8)
    expected = forward if mode == 'inference' else forward + 2 * forward - 2 * 10 * 16 * 32
    assert flops == expected
    assert profile['regions']['MLP']['flops'] == flops  # forward and backward


def test_regions_of_a_soft_training_step():
    """Forward and backward time lands in SOFT's regions, FLOPs in the
    products; the hooks and wrappers are gone afterwards."""
    from mmsoft.models import SOFT
    from mmsoft.models import soft as soft_kernels
    torch.manual_seed(0)
    model = SOFT(arch='tiny', variant='soft++', solver='newton_closed_form',
                 drop_path_rate=0.)

    class Maps(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = model

        def forward(self, x):
            return model.forward_intermediates(x, intermediates_only=True)

    original = soft_kernels.kernel_inverse
    profile = profile_step(Maps(), torch.randn(1, 3, 64, 96), 'train', repeats=1,
                           warmup=0)
    regions = profile['regions']
    for name in ('stem and patch embedding', 'Gaussian kernel', 'kernel inverse',
                 'kernel products', 'MLP', 'attention projections'):
        assert regions[name]['us'] > 0, name
    for name in ('MLP', 'attention projections', 'kernel products'):
        assert regions[name]['flops'] > 0, name
    assert soft_kernels.kernel_inverse is original
    assert not model.stages[0].patch_embed._forward_hooks


def test_attribution_follows_backward_to_its_forward_region():
    from torch.profiler import profile
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with profile_regions(nn.Sequential(layer)), profile(record_shapes=True) as prof:
        layer(x).sum().backward()
    tables = attribute(prof.events())
    # nn.Linear is no region of its own: forward and backward are 'other'
    assert set(tables['regions']) == {'other'}
    assert tables['regions']['other']['flops'] == 3 * 2 * 4 * 8 * 8


def test_variants_parse_and_refuse():
    label, spec = parse_variant('plain=plain:MLP/ConvPatchEmbed,memory_efficient=False')
    assert label == 'plain'
    assert spec['plain'] == ['MLP', 'ConvPatchEmbed']
    assert spec['kwargs'] == dict(memory_efficient=False)
    assert parse_variant('peer=backbone:swin-t,compile')[1]['backbone'] == 'swin-t'
    with pytest.raises(ValueError, match='LABEL=ITEM'):
        parse_variant('plain')
    with pytest.raises(ValueError, match="item 'bogus'"):
        parse_variant('x=bogus')
    with pytest.raises(ValueError, match='backbone:nope'):
        parse_variant('x=backbone:nope')


def test_ab_compare_runs_variants_in_turns(tmp_path):
    out = tmp_path / 'ab.jsonl'
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/ab_compare.py'), '--backbone',
         'soft++-tiny', '--size', '256x320', '--mode', 'train', '--rounds', '2',
         '--warmup', '0', '--out', str(out), '--variant', 'twin=',
         '--variant', 'plain=memory_efficient=False'],
        env=worker_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text().splitlines()[-1])
    twin, plain = record['variants']['twin'], record['variants']['plain']
    assert len(twin['all_seconds']) == len(plain['all_seconds']) == 2
    assert twin['time_ratio'] == 1.0 and twin['memory_ratio'] == 1.0
    # plain autograd keeps the query-bottleneck kernels and MLP activations
    assert plain['live_peak_bytes'] > 1.2 * twin['live_peak_bytes']


def test_profile_backbone_writes_its_report(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/profile_backbone.py'),
         '--backbones', 'soft++-tiny', '--sizes', '64x96', '--modes', 'inference',
         '--repeats', '1', '--out-dir', str(tmp_path)],
        env=worker_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / 'profile.json').read_text())
    result, = record['results']
    assert result['backbone'] == 'soft++-tiny' and result['seconds'] > 0
    assert record['meta']['matmul_flops_per_s'] > 1e8
    report = (tmp_path / 'profile.md').read_text()
    assert '| Gaussian kernel |' in report and 'soft++-tiny' in report


def test_flops_of_fused_attention_with_few_keys():
    """N queries on M keys: 4 N M d forward and twice that backward, whatever
    the order of the backward's operands."""
    from torch.profiler import profile
    query = torch.randn(1, 2, 40, 8, requires_grad=True)
    keys = torch.randn(1, 2, 7, 8, requires_grad=True)
    values = torch.randn(1, 2, 7, 8, requires_grad=True)
    with profile(record_shapes=True) as prof:
        torch.nn.functional.scaled_dot_product_attention(query, keys, values).sum().backward()
    flops = attribute(prof.events())['classes']['fused attention']['flops']
    assert flops == 3 * 4 * 2 * 40 * 7 * 8
