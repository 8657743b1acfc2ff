"""FLOP handles (counts known by hand) and the benchmark/FLOP tools' output."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the stack and floor environments')

import csv
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft_analysis.flop_handles import (INVERSE_FUNCTIONS, count_flops,
                                           kernel_inverse_handle)
from mmsoft.models.soft import SoftAttention
from mmsoft.models.soft import gaussian_kernel, kernel_inverse
from mmsoft.models.common import set_memory_efficient
from mmsoft.models.soft import newton_iterations

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


def test_benchmark_tool_writes_results(tmp_path):
    out_dir = tmp_path / 'bench'
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/benchmark.py'), '--models',
         'soft-tiny', '--sizes',
         '64x64', '96x128', '--repeats', '1', '--warmup', '0', '--device', 'cpu',
         '--out-dir', str(out_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert '[2/2] soft-tiny 96x128' in done.stdout
    data = json.loads((out_dir / 'results.json').read_text())
    assert data['meta']['matmul_gmacs'] > 0
    rows = data['results']
    assert [(r['height'], r['width']) for r in rows] == [(64, 64), (96, 128)]
    assert all(r['seconds'] > 0 and r['peak_bytes'] >= 0 for r in rows)
    with open(out_dir / 'results.csv') as file:
        assert len(list(csv.DictReader(file))) == 2
    assert (out_dir / 'scaling.png').stat().st_size > 1000


def test_benchmark_rejects_unknown_model():
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/benchmark.py'), '--models',
         'resnet-50', '--sizes', '64x64'], capture_output=True, text=True)
    assert done.returncode != 0
    assert "backbone 'resnet-50' is not known" in done.stderr


def test_benchmark_inverse_times_the_inverse_training_runs():
    """tools/analysis/benchmark_inverse.py runs the memory-efficient inverse,
    as SOFT attention trains: autograd keeps P and the step size, not the
    tensors of each of the 20 Newton steps that the plain path keeps."""
    import benchmark_inverse
    tokens = torch.randn(1, 2, 16, 8)
    mats = gaussian_kernel(tokens, tokens)  # (1, 2, 16, 16)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda tensor: kept.append(tensor) or tensor, lambda tensor: tensor):
        inverse = benchmark_inverse.solver_step(mats, 'soft++', 'newton', 20, True)
        by_tool = len(kept)
        kernel_inverse(mats.detach().requires_grad_(), 'soft++', 'newton', 20)
    assert (by_tool, len(kept) - by_tool) == (2, 81)
    torch.testing.assert_close(inverse, kernel_inverse(mats, 'soft++', 'newton', 20))


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


def test_bottleneck_pooling_tool_reports_grids_and_differences(tmp_path):
    from mmsoft.openmmlab import SOFT
    torch.manual_seed(0)
    weights = tmp_path / 'soft_tiny.pth'
    model = SOFT(arch='tiny')
    model.init_weights()
    torch.save(model.state_dict(), weights)
    result_path = tmp_path / 'pooling.json'
    done = subprocess.run(
        [sys.executable, str(REPO / 'tools/analysis/bottleneck_pooling.py'),
         '--arch', 'tiny', '--sizes', '64x64', '128x128', '--cap', '9',
         '--checkpoint', str(weights), '--json', str(result_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    small, large = json.loads(result_path.read_text())['results']
    # 64x64: 2x2 bottleneck grids in every stage, within the cap of 9.
    assert small['grids'] == [[[2, 2], [2, 2]]] * 3
    assert small['relative_difference'] == [0.0] * 4
    # 128x128: 4x4 grids pooled to 3x3, which changes every stage's output.
    assert large['grids'] == [[[4, 4], [3, 3]]] * 3
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
