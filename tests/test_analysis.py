"""FLOP handles (counts known by hand) and the benchmark/FLOP tools' output."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack '
                    'and floor environments')

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft_analysis.flop_handles import (INVERSE_FUNCTIONS, count_flops,
                                          kernel_inverse_handle)
from mmsoft.models.common import set_memory_efficient
from mmsoft.models.soft import SoftAttention
from mmsoft.ops.kernel_inverse import gaussian_kernel, kernel_inverse, newton_iterations
from tests.helpers.tools import load_tool

pytestmark = pytest.mark.openmmlab

REPO = Path(__file__).resolve().parents[1]


class KernelModule(nn.Module):

    def forward(self, x, y):
        return gaussian_kernel(x, y)


class SDPAModule(nn.Module):

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class NewtonModule(nn.Module):

    def forward(self, operand, alpha):
        return newton_iterations(operand, alpha, 7)


class InverseModule(nn.Module):

    def __init__(self, variant, solver):
        super().__init__()
        self.variant, self.solver = variant, solver

    def forward(self, a):
        return kernel_inverse(a, self.variant, self.solver, 7)


def test_gaussian_kernel_flops_by_hand():
    n, m, d = 6, 4, 3
    total, analyzer = count_flops(KernelModule(), (torch.randn(1, n, d),
                                                   torch.randn(1, m, d)))
    squares = (n + m) * d  # pow
    sums = (n + m) * d  # reduction over d
    halves = n + m  # * -0.5
    product = n * m * (d + 2)  # lifted matmul
    exps = n * m
    assert total == squares + sums + halves + product + exps
    assert not analyzer.unsupported_ops()


def test_sdpa_flops_by_hand():
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 7, 4)
    total, _ = count_flops(SDPAModule(), (q, k, torch.randn(1, 2, 7, 4)))
    assert total == 2 * (2 * 5 * 7 * 4)  # Q K^T and attn V


def test_newton_iteration_flops_by_hand():
    total, analyzer = count_flops(NewtonModule(), (torch.rand(3, 2, 5, 5),
                                                   torch.rand(3, 2, 1, 1)))
    # 6 matrices: V0 = alpha P, then per step two 5x5 products, traced op by
    # op; the second folds ``2 V - ...`` into a baddbmm, counted as addmm is
    # (its product).
    assert total == 6 * 5**2 + 7 * 6 * 2 * 5**3
    assert dict(analyzer.by_operator()) == {
        'matmul': 7 * 6 * 5**3, 'baddbmm': 7 * 6 * 5**3, 'mul': 6 * 5**2}


@pytest.mark.parametrize('variant, solver, factor', [
    ('soft', 'exact', 1), ('soft++', 'exact', 10 / 3),
    ('soft++', 'newton_closed_form', 10 / 3)])
def test_one_node_inverse_flops_by_hand(variant, solver, factor):
    from mmengine.analysis import FlopAnalyzer
    points = 2 * torch.randn(3, 2, 5, 4)
    analyzer = FlopAnalyzer(InverseModule(variant, solver),
                            (gaussian_kernel(points, points), ))
    handle = kernel_inverse_handle(variant, solver)
    analyzer.set_op_handle(**{f'prim::PythonOp.{name}': handle
                              for name in INVERSE_FUNCTIONS})
    counts = analyzer.by_operator()
    function = 'ExactInverse' if solver == 'exact' else 'NewtonClosedForm'
    assert counts[f'PythonOp.{function}'] == int(factor * 6 * 5**3)


def test_soft_tiny_flops_near_paper():
    from mmsoft.openmmlab import SOFT
    model = SOFT(arch='tiny', solver='newton').eval()
    images = torch.randn(1, 3, 224, 224)
    total, analyzer = count_flops(model, (images, ))
    exact = count_flops(SOFT(arch='tiny', solver='exact').eval(), (images, ))[1]
    # What mmengine counts itself, and the projections into maps (baddbmm).
    products = sum(analyzer.by_operator().get(op, 0) for op in (
        'conv', 'linear', 'matmul', 'baddbmm', 'batch_norm', 'layer_norm'))
    newton = sum(analyzer.by_operator()[op] - exact.by_operator()[op]
                 for op in ('matmul', 'baddbmm'))
    # The paper's 1.9G, and the Newton iteration's products, traced step by
    # step: 40 inverses of 49x49, two products per step, 20 steps, and the
    # step size's A (A 1).
    assert (products - newton) / 1e9 == pytest.approx(1.93, abs=0.01)
    assert newton == 40 * (2 * 20 * 49**3 + 49**2)
    # + exp, the norms and softmax attention.
    assert total / 1e9 == pytest.approx(2.13, abs=0.01)
    assert not analyzer.unsupported_ops()


def test_inverse_tool_times_every_solver(monkeypatch, capsys):
    """``soft_bottleneck.py inverse``: each solver against the exact one and
    its difference from the Newton iteration (0 for the iteration itself)."""
    tool = load_tool('analysis/soft_bottleneck')
    monkeypatch.setattr(sys, 'argv', ['soft_bottleneck.py', 'inverse', '--sizes', '16',
                                      '--heads', '2', '--repeats', '1'])
    rows = list(tool.inverse_rows(tool.parse_args()))
    assert [(r['attention'], r['solver']) for r in rows] == [
        (a, s) for a in ('soft', 'soft++')
        for s in ('newton', 'newton_closed_form', 'exact')]
    assert all(r['seconds'] > 0 for r in rows)
    assert [r['difference_from_newton'] for r in rows if r['solver'] == 'newton'] == \
        [0.0, 0.0]
    assert rows[1]['difference_from_newton'] < 1e-4
    assert 'm=   16 soft++ exact' in capsys.readouterr().out


@pytest.mark.mmcv_ops  # the tool builds a Mask R-CNN config
def test_get_flops_tool_backbone_only(tmp_path):
    config = tmp_path / 'soft_tiny_config.py'
    config.write_text(
        "_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py']\n"
        "custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)\n"
        "model = dict(backbone=dict(_delete_=True, type='SOFT', arch='tiny', "
        "solver='newton'), neck=dict(in_channels=[64, 128, 320, 512]))\n")
    result_path = tmp_path / 'flops.json'
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/get_flops.py'), str(config),
         '--backbone-only', '--shape', '224', '224', '--json', str(result_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(result_path.read_text())
    assert result['gflops'] == pytest.approx(2.14, abs=0.01)
    assert result['params_m'] == pytest.approx(12.56, abs=0.01)
    assert f"FLOPs: {result['gflops']:.2f} G" in done.stdout


def test_closed_form_solver_is_fully_counted():
    from mmsoft.openmmlab import SOFT
    arch = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                depths=[1, 1, 1, 1])
    images = torch.randn(1, 3, 128, 128)
    totals = {}
    for solver in ('newton', 'newton_closed_form'):
        model = SOFT(arch=arch, solver=solver).eval()
        totals[solver], analyzer = count_flops(model, (images, ))
        assert not analyzer.unsupported_ops(), solver
    # One eigendecomposition (10/3 m^3) in place of 20 steps (40 m^3).
    assert totals['newton_closed_form'] < totals['newton']


def test_pooling_tool_reports_grids_and_differences(monkeypatch):
    tool = load_tool('analysis/soft_bottleneck')
    monkeypatch.setattr(sys, 'argv', ['soft_bottleneck.py', 'pooling', '--sizes',
                                      '64x64', '128x128', '--cap', '9'])
    small, large = tool.pooling_rows(tool.parse_args())
    # 64x64: 2x2 bottleneck grids in every stage, within the cap of 9.
    assert small['grids'] == [((2, 2), (2, 2))] * 3
    assert small['relative_difference'] == [0.0] * 4
    # 128x128: 4x4 grids pooled to 3x3, which changes every stage's output.
    assert large['grids'] == [((4, 4), (3, 3))] * 3
    assert all(d > 1e-3 for d in large['relative_difference'])


def test_soft_attention_is_counted_as_its_plain_operations():
    """Traced, the layer runs its plain operations whatever its switch and
    chunking: the kernel, the iteration and the products, op by op."""

    class OnGrid(nn.Module):

        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x, (6, 8))

    torch.manual_seed(0)
    layer = SoftAttention(16, 2, sr_ratio=2, local_kernel_size=3,
                          kernel_chunk_tokens=8).train()
    x = torch.randn(1, 48, 16)
    efficient, analyzer = count_flops(OnGrid(layer), (x, ))
    plain, _ = count_flops(OnGrid(set_memory_efficient(layer, False)), (x, ))
    assert efficient == plain
    assert not analyzer.unsupported_ops()
    assert not any('PythonOp' in op for op in analyzer.by_operator())
