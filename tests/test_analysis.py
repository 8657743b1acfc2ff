"""FLOP handles (counts known by hand) and the benchmark/FLOP tools' output."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.analysis import count_flops
from mmsoft.models.flop_handles import kernel_inverse_handle
from mmsoft.models.layers import gaussian_kernel, kernel_inverse

REPO = Path(__file__).resolve().parents[1]


class KernelModule(nn.Module):

    def forward(self, x, y):
        return gaussian_kernel(x, y)


class SDPAModule(nn.Module):

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class InverseModule(nn.Module):

    def forward(self, a):
        return kernel_inverse(a, 'soft', 'newton', 7)


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


def test_inverse_flops_by_hand():
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(InverseModule(), (torch.rand(3, 2, 5, 5), ))
    analyzer.set_op_handle(**{'prim::PythonOp._NewtonIterations':
                              kernel_inverse_handle('soft', 'newton', 7)})
    # Two 5x5 products per iteration, 7 iterations, 6 matrices.
    assert analyzer.total() == 6 * 7 * 2 * 5**3
    exact = kernel_inverse_handle('soft', 'exact', 20)
    assert exact is not None


def test_soft_tiny_flops_near_paper():
    from mmsoft.models.backbones import SOFT
    model = SOFT(arch='tiny', solver='newton').eval()
    images = torch.randn(1, 3, 224, 224)
    plain, _ = count_flops(model, (images, ), with_extra_handles=False)
    total, analyzer = count_flops(model, (images, ))
    assert plain / 1e9 == pytest.approx(1.93, abs=0.01)
    # + 40 Newton inverses of 49x49 (0.19G), exp, softmax attention.
    assert total / 1e9 == pytest.approx(2.14, abs=0.01)
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
    assert 'FLOPs: 2.14 G' in done.stdout


def test_closed_form_solver_is_fully_counted():
    from mmsoft.models.backbones import SOFT
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
    from mmsoft.models.backbones import SOFT
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


def test_chunked_kernel_product_is_counted():
    from mmsoft.models.layers import gaussian_kernel
    from mmsoft.models.memory_efficient.kernel_attention import \
        chunked_kernel_inference

    class Product(torch.nn.Module):

        def __init__(self, chunk):
            super().__init__()
            self.chunk = chunk

        def forward(self, queries, bottleneck, middle, values):
            return chunked_kernel_inference(queries, bottleneck, middle, values,
                                            self.chunk)

    queries, values = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    bottleneck, middle = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 5)
    inputs = (queries, bottleneck, middle, values)
    total, analyzer = count_flops(Product(16), inputs)
    assert not analyzer.unsupported_ops()
    # Traced, the product is counted; in chunks it costs the one-chunk count
    # plus the per-chunk work on the bottleneck (its squared norms) and the
    # summary's accumulation.
    one_chunk, _ = count_flops(Product(40), inputs)
    assert one_chunk < total < 1.1 * one_chunk
    kernel = gaussian_kernel(queries, bottleneck)
    expected = kernel @ (middle @ (kernel.transpose(-1, -2) @ values))
    assert torch.allclose(torch.jit.trace(Product(16), inputs)(*inputs), expected,
                          atol=1e-5)
