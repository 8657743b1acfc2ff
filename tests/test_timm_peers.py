"""timm's peers in the cost benchmarks: PVTv2-b2-li and XCiT-S12.

Built through mmpretrain's ``TIMMBackbone`` (timm and mmpretrain need
torchvision, absent from the floor environment: those tests are marked
``torchvision``); mmsoft and the benchmark tools must import without them.
"""
import subprocess
import sys
import textwrap
from math import ceil
from pathlib import Path

import pytest
import torch
import torch.nn as nn

# The benchmark tools and mmpretrain's TIMMBackbone are OpenMMLab's.
pytestmark = pytest.mark.openmmlab

REPO = Path(__file__).resolve().parents[1]
SHAPE = (96, 160)  # non-square
STRIDES = (4, 8, 16, 32)
CHANNELS = {'pvtv2-b2-li': (64, 128, 320, 512), 'xcit-s12': (384, ) * 4}
TIMM_PEERS = list(CHANNELS)

NO_TIMM_PROBE = textwrap.dedent('''
    import importlib.abc, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('timm', 'mmpretrain', 'torchvision'):
                raise ModuleNotFoundError(f'No module named {name!r}')

    sys.meta_path.insert(0, Absent())
    import os, runpy
    sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as the tool runs
    import mmsoft_analysis.detector_step, mmsoft_analysis.flop_handles  # noqa
    import mmsoft_analysis.measure, mmsoft_analysis.report  # noqa
    from mmsoft_analysis.peers import build_backbone, parse_spec
    assert parse_spec('xcit-s12:drop_path_rate=0') == ('xcit-s12',
                                                       dict(drop_path_rate=0))
    tool = runpy.run_path(sys.argv[1], run_name='benchmark')
    sys.argv = ['benchmark.py', '--detectors', 'pvtv2-b2-li', 'xcit-s12']
    args = tool['parse_args']()
    print('MODELS', *args.models)
    print('DETECTORS', *args.detectors)
    try:
        build_backbone('pvtv2-b2-li')
    except ImportError as error:
        print('IMPORT ERROR:', error)
    assert not {'timm', 'mmpretrain'} & set(sys.modules)
''')


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny inputs: on 2 busy cores a second thread only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tools_import_and_name_the_peers_without_timm():
    tool = str(REPO / 'tools/analysis/benchmark.py')
    done = subprocess.run([sys.executable, '-c', NO_TIMM_PROBE, tool],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert 'swin-t pvtv2-b2 pvtv2-b2-li xcit-s12\n' in done.stdout  # the defaults
    assert 'DETECTORS pvtv2-b2-li xcit-s12\n' in done.stdout
    assert "IMPORT ERROR: timm's pvt_v2_b2_li needs timm and mmpretrain" in done.stdout


def expected_maps(name, batch=1):
    return [(batch, c, ceil(SHAPE[0] / s), ceil(SHAPE[1] / s))
            for c, s in zip(CHANNELS[name], STRIDES)]


@pytest.mark.torchvision
@pytest.mark.parametrize('name', TIMM_PEERS)
def test_timm_peer_gives_four_maps_and_trains(name):
    from mmsoft_analysis.measure import run_once
    from mmsoft_analysis.peers import build_backbone
    torch.manual_seed(0)
    model = build_backbone(name)
    assert not model.training
    images = torch.randn(1, 3, *SHAPE)
    with torch.no_grad():
        maps = model(images)
    assert [tuple(m.shape) for m in maps] == expected_maps(name)
    model.train()
    outputs = model(images)  # what measure.run_once(backward=True) runs
    sum(out.float().mean() for out in outputs).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    run_once(model, images, backward=True)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.torchvision
def test_xcit_reads_blocks_3_5_7_11_and_resamples_them_like_xcit_detection():
    import timm
    from mmsoft_analysis.peers import build_backbone
    torch.manual_seed(0)
    model = build_backbone('xcit-s12:drop_path_rate=0.0')
    full = timm.create_model('xcit_small_12_p16_224', pretrained=False).eval()
    missing, _ = full.load_state_dict(model.trunk.timm_model.model.state_dict(),
                                      strict=False)
    # features_only dropped the class-attention part, the final norm, the head.
    assert {k.split('.')[0] for k in missing} == {'cls_token', 'cls_attn_blocks',
                                                  'norm', 'head'}
    images = torch.randn(1, 3, *SHAPE)
    with torch.no_grad():
        blocks = full.forward_intermediates(images, indices=[3, 5, 7, 11],
                                            intermediates_only=True)
        maps = model(images)
    up4, up2, same, down2 = model.pyramid.branches.values()
    # mmsoft's GELU is nn.GELU with a backward that is right on torch 2.1.
    assert [nn.GELU if isinstance(m, nn.GELU) else type(m) for m in up4] == [
        nn.ConvTranspose2d, nn.BatchNorm2d, nn.GELU, nn.ConvTranspose2d]
    assert (up2.kernel_size, up2.stride, down2.kernel_size) == ((2, 2), (2, 2), 2)
    with torch.no_grad():
        expected = [up4(blocks[0]), up2(blocks[1]), same(blocks[2]), down2(blocks[3])]
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want)


@pytest.mark.torchvision
@pytest.mark.parametrize('name', TIMM_PEERS)
def test_timm_peer_attention_is_counted(name):
    """mmengine's counter sees XCiT's ``q @ k^T`` and ``attn @ v`` (plain
    matmuls); PVTv2's fused attention only through mmsoft's handle."""
    from mmsoft_analysis.flop_handles import count_flops
    from mmsoft_analysis.peers import build_backbone
    model = build_backbone(name)
    with torch.no_grad():
        total, analyzer = count_flops(model, (torch.randn(1, 3, *SHAPE), ))
    by_op = analyzer.by_operator()
    h, w = SHAPE[0] // 16, SHAPE[1] // 16
    if name == 'xcit-s12':
        # 12 blocks x 8 heads: (48 x N) @ (N x 48) and (48 x 48) @ (48 x N).
        assert by_op['matmul'] == 12 * 8 * 2 * 48 * 48 * (h * w)
        # Position encoding (sin, cos), the d x d softmax and the max pool:
        # not counted, as for UFO-ViT; expand_as does no arithmetic.
        assert set(analyzer.unsupported_ops()) <= {
            'aten::sin', 'aten::cos', 'aten::softmax', 'aten::max_pool2d',
            'aten::expand_as'}
    else:
        # Keys pooled to 7 x 7 in every stage: 2 * heads * Nq * 49 * 64.
        stages = [(3, 1, 4), (4, 2, 8), (6, 5, 16), (3, 8, 32)]
        assert by_op['scaled_dot_product_attention'] == sum(
            depth * 2 * heads * (SHAPE[0] // s) * (SHAPE[1] // s) * 49 * 64
            for depth, heads, s in stages)
        assert not analyzer.unsupported_ops()
    assert total == sum(by_op.values())


@pytest.mark.mmcv_ops  # builds Mask R-CNN (RoIAlign, NMS)
@pytest.mark.torchvision
@pytest.mark.parametrize('name', TIMM_PEERS)
def test_timm_peer_mask_rcnn_step(name):
    from mmsoft_analysis.detector_step import build_detector, generated_batch
    from configs.comparison.peer_backbones import IsotropicPyramid
    torch.manual_seed(0)
    # Fewer sampled anchors and RoIs: the heads' fixed cost dominates a tiny
    # image (6 s a step with the config's 256 anchors and 512 RoIs, 1.5 s so).
    model = build_detector(name, {'model.train_cfg.rpn.sampler.num': 32,
                                  'model.train_cfg.rpn_proposal.nms_pre': 200,
                                  'model.train_cfg.rpn_proposal.max_per_img': 50,
                                  'model.train_cfg.rcnn.sampler.num': 32})
    assert model.training and model.train_cfg.rcnn.sampler.num == 32
    if name == 'xcit-s12':
        assert isinstance(model.backbone, IsotropicPyramid)
    data = generated_batch(model, 1, SHAPE)
    with torch.no_grad():
        maps = model.backbone(data['inputs'])
    assert [tuple(m.shape) for m in maps] == expected_maps(name)
    losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
