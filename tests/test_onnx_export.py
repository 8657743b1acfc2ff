"""ONNX export of the backbones and onnxruntime parity with eager PyTorch.

Each model is exported once, traced at one size, and run in onnxruntime at
two other sizes: the graph must follow the input size (dynamic height and
width), including the bottleneck cap and the position-embedding resize. SOFT++
runs in eager with the configs' solver, ``'newton_closed_form'`` (one
eigendecomposition), and is exported as the Newton iteration: the parity
checks that the two formulations are the same function.
"""
import os.path as osp

import pytest
import torch

pytest.importorskip('onnxruntime')
pytest.importorskip('onnx')

from mmsoft.deployment import onnx_export  # noqa: E402
from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.models.soft import SoftAttention
from mmsoft.models.soft import capped_grid_size
from mmsoft.deployment.traceable import (traceable_cap_bottleneck_grid,
                                         traceable_capped_grid_size)
from mmsoft.utils.torch_compat import TORCH_VERSION  # noqa: E402
from tests.helpers.tools import load_tool  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIG = osp.join(REPO, 'configs/demo/mask-rcnn_soft-tiny_fpn_demo.py')
TOLERANCE = 1e-4
TRACE_SHAPE = (64, 64)
# 64x96: stage-1 bottleneck grid 2x3, under the cap; 97x151: 4x5, pooled.
VERIFY_SHAPES = [(64, 96), (97, 151)]
SMALL_SOFT = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                  depths=[1, 1, 1, 1], stem_channels=8)


def small_soft(**kwargs) -> SOFT:
    """A small SOFT++ with the configs' solver, a cap and chunking in reach."""
    settings = dict(arch=SMALL_SOFT, variant='soft++',
                    solver='newton_closed_form', max_bottleneck_tokens=8,
                    kernel_chunk_tokens=256, drop_path_rate=0.)
    settings.update(kwargs)
    torch.manual_seed(0)
    model = SOFT(**settings)
    model.init_weights()
    return model.eval()


def export_and_verify(model, tmp_path) -> list:
    """Exports ``model`` at TRACE_SHAPE, checks the file, verifies at VERIFY_SHAPES."""
    path = str(tmp_path / 'model.onnx')
    onnx_export.export_onnx(model, path, TRACE_SHAPE)
    onnx_export.check_onnx_file(path)
    session = onnx_export.onnxruntime_session(path, threads=1)
    return onnx_export.verify_onnx(model, session, VERIFY_SHAPES)


def test_soft_plus_plus_matches_in_onnxruntime(tmp_path):
    model = small_soft()
    results = export_and_verify(model, tmp_path)
    for result in results:
        assert result['relative'] < TOLERANCE, result
    # The eager model keeps its own solver and formulation after the export.
    layers = [m for m in model.modules() if isinstance(m, SoftAttention)]
    assert {m.solver for m in layers} == {'newton_closed_form'}
    switched = [m for m in model.modules() if hasattr(m, 'exportable')]
    assert len(switched) == len(model.stages) + len(layers)
    assert all(stage in switched for stage in model.stages)
    # Switched back: the layers run their eager formulation again.
    assert not any(m.exportable for m in switched)


def test_ufo_vit_matches_in_onnxruntime(tmp_path):
    torch.manual_seed(0)
    model = UFOViT(arch=dict(embed_dims=32, depth=4, num_heads=2),
                   drop_path_rate=0.)
    model.init_weights()
    if TORCH_VERSION < onnx_export.CEIL_MODE_POOL_EXPORT_TORCH:
        # The oldest supported torch refuses, naming the layer and the torch
        # that exports it.
        with pytest.raises(ValueError, match=r'pyramid\.branches\.3: torch .* cannot '
                           r'export MaxPool2d\(ceil_mode=True\)'):
            onnx_export.export_onnx(model, str(tmp_path / 'model.onnx'), TRACE_SHAPE)
        return
    for result in export_and_verify(model.eval(), tmp_path):
        assert result['relative'] < TOLERANCE, result


def test_exact_solver_is_refused_at_export(tmp_path):
    model = small_soft(solver='exact')
    with pytest.raises(ValueError, match=r"solver='exact' has no ONNX formulation"):
        onnx_export.export_onnx(model, str(tmp_path / 'model.onnx'), TRACE_SHAPE)
    assert not (tmp_path / 'model.onnx').exists()


def test_bad_sample_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r'sample_shape=\(16, 64\) is invalid'):
        onnx_export.export_onnx(small_soft(), str(tmp_path / 'm.onnx'), (16, 64))


@pytest.mark.parametrize('cap', [1, 8, 64, 256])
def test_traced_bottleneck_cap_equals_eager_cap(cap):
    """Branch-free sizes equal the Python ones; the matrix pooling equals
    adaptive average pooling up to rounding."""
    for height in range(1, 40):
        for width in (1, 2, 3, 5, 17, 42, 167, 334):
            rows, cols = traceable_capped_grid_size(
                torch.tensor(height), torch.tensor(width), cap)
            assert (rows.item(), cols.item()) == capped_grid_size(height, width, cap)
    grid = torch.randn(2, 3, 25, 42)
    expected = torch.nn.functional.adaptive_avg_pool2d(grid,
                                                       capped_grid_size(25, 42, cap))
    torch.testing.assert_close(traceable_cap_bottleneck_grid(grid, cap), expected,
                               rtol=1e-6, atol=1e-6)


def run_tool(argv):
    """``tools/deployment/export_onnx.py``'s ``main`` in this process."""
    return load_tool('deployment/export_onnx').main(argv)


@pytest.mark.openmmlab  # the tool reads mmengine configs
def test_checkpoint_without_neck_weights_is_refused(tmp_path):
    tool = load_tool('deployment/export_onnx')
    backbone = small_soft()
    path = str(tmp_path / 'backbone.pth')
    torch.save(backbone.state_dict(), path)
    tool.load_feature_weights(tool.FeatureMaps(small_soft()), path)
    with_neck = tool.FeatureMaps(small_soft(), torch.nn.Conv2d(1, 1, 1))
    with pytest.raises(ValueError, match='lacks 2 weights of the exported model'):
        tool.load_feature_weights(with_neck, path)


@pytest.mark.mmcv_ops  # the tool builds the detector config
def test_tool_exports_backbone_and_neck(tmp_path, capsys):
    """The demo detector's SOFT++ + FPN (depths cut to 1 per stage)."""
    out = str(tmp_path / 'soft_fpn.onnx')
    code = run_tool([
        DET_CONFIG, '--out', out, '--with-neck', '--shape', '64x64',
        '--verify-shapes', '97x151', '--threads', '1', '--benchmark', '64x96',
        '--repeats', '1', '--profile',
        '--cfg-options', 'model.backbone.solver=newton_closed_form',
        'model.backbone.arch.depths=[1,1,1,1]'])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'onnx checker: OK' in printed
    assert '97x151 out4' in printed  # FPN's five levels
    assert '(tolerance 0.0001): OK' in printed
    assert '64x96, 1 thread(s): PyTorch' in printed
    assert 'MatMul' in printed  # the profile's operator types


@pytest.mark.mmcv_ops  # the tool builds the detector config
def test_tool_names_the_solver_it_cannot_export(tmp_path):
    """The demo config's exact solver is refused before anything is written."""
    out = tmp_path / 'soft.onnx'
    with pytest.raises(ValueError, match="solver='exact'"):
        run_tool([DET_CONFIG, '--out', str(out), '--cfg-options',
                  'model.backbone.arch.depths=[1,1,1,1]'])
    assert not out.exists()


@pytest.mark.frameworks
@pytest.mark.parametrize('kwargs,ranks', [
    (dict(num_classes=10), [2]),  # a classifier: one (B, 10) tensor
    (dict(features_only=True, out_indices=(1, 3)), [4, 4]),  # a list of maps
])
def test_timm_model_exports_and_matches_in_onnxruntime(kwargs, ranks, tmp_path):
    """``export_onnx`` takes a model made by ``timm.create_model``; its graph
    follows the input size and computes what the eager model computes."""
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    model = timm.create_model('soft_plus_plus_tiny', **kwargs).eval()
    path = str(tmp_path / 'timm.onnx')
    names = onnx_export.export_onnx(model, path, TRACE_SHAPE)
    assert names == [f'out{i}' for i in range(len(ranks))]
    onnx_export.check_onnx_file(path)
    session = onnx_export.onnxruntime_session(path, threads=1)
    results = onnx_export.verify_onnx(model, session, VERIFY_SHAPES, batch=2)
    for result in results:
        assert [len(m['shape']) for m in result['maps']] == ranks
        assert all(m['shape'][0] == 2 for m in result['maps'])  # dynamic batch
        assert result['relative'] < TOLERANCE, result


def test_outputs_are_flattened_in_order():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3, ), 2.)
    flat = onnx_export.output_tensors({'x': a, 'y': [b, (c, )]})
    assert len(flat) == 3 and all(x is y for x, y in zip(flat, (a, b, c)))
    with pytest.raises(TypeError, match='output of type str cannot be exported'):
        onnx_export.output_tensors([a, 'text'])
