"""An image's features do not depend on how its batch was padded."""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import torch
from mmengine.config import Config

from mmsoft.openmmlab import SOFT, UFOViT
from mmsoft.openmmlab.backbones import register_valid_shapes

pytestmark = pytest.mark.openmmlab

# SOFT-tiny's layout at tiny widths; bottleneck strides 4, 2, 1 give 4x6
# bottleneck grids for a 64x96 image, so a cap of 12 pools them.
SOFT_ARCH = dict(embed_dims=[16, 32, 64, 64], num_heads=[1, 2, 2, 2],
                 depths=[1, 1, 1, 1], stem_channels=8, sr_ratios=[4, 2, 1, 1])
UFO_ARCH = dict(embed_dims=32, depth=4, num_heads=2)
IMAGE = (64, 96)
# (canvas, batch-mate's size, the image's index in the batch)
BATCHES = [((64, 128), (48, 128), 0), ((96, 128), (96, 80), 1)]


def _padded_batch(image, canvas, mate_shape, index):
    """The image and a random batch-mate, top-left on zero canvases."""
    mate = torch.randn(1, 3, *mate_shape)
    batch = torch.zeros(2, 3, *canvas)
    shapes = [None, None]
    for slot, picture in ((index, image), (1 - index, mate)):
        height, width = picture.shape[-2:]
        batch[slot, :, :height, :width] = picture[0]
        shapes[slot] = (height, width)
    return batch, shapes


def _assert_same_in_region(model, image_shape=IMAGE):
    """Image alone vs in each of BATCHES: equal inside its region, zero outside."""
    torch.manual_seed(1)
    image = torch.randn(1, 3, *image_shape)
    model.eval()
    with torch.no_grad():
        alone = model(image)
        for canvas, mate_shape, index in BATCHES:
            batch, shapes = _padded_batch(image, canvas, mate_shape, index)
            padded = model(batch, valid_shapes=shapes)
            for stage, (ref, out) in enumerate(zip(alone, padded)):
                height, width = ref.shape[-2:]
                region = out[index, :, :height, :width]
                assert (region - ref[0]).abs().max() < 1e-4, (stage, canvas)
                outside = out[index].clone()
                outside[:, :height, :width] = 0
                assert not outside.any(), (stage, canvas)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
@pytest.mark.parametrize('cap', [None, 12])
def test_soft_features_ignore_padding(variant, solver, cap):
    torch.manual_seed(0)
    model = SOFT(arch=SOFT_ARCH, variant=variant, solver=solver,
                 max_bottleneck_tokens=cap)
    model.init_weights()
    _assert_same_in_region(model)


@pytest.mark.parametrize('image_shape', [IMAGE, (48, 80)])
def test_ufo_vit_features_ignore_padding(image_shape):
    # Large layer scales, so that every branch changes the features; a
    # 48x80 image has an odd stride-16 grid (3x5), whose stride-32 max pool
    # has a window reaching into the padding.
    torch.manual_seed(0)
    model = UFOViT(arch=UFO_ARCH, layer_scale_init_value=0.5)
    model.init_weights()
    _assert_same_in_region(model, image_shape)


@pytest.mark.parametrize('model_cls, kwargs', [(SOFT, dict(arch=SOFT_ARCH)),
                                               (UFOViT, dict(arch=UFO_ARCH))])
def test_full_regions_are_bit_identical_to_none(model_cls, kwargs):
    torch.manual_seed(0)
    model = model_cls(**kwargs)
    model.init_weights()
    model.eval()
    images = torch.randn(2, 3, *IMAGE)
    with torch.no_grad():
        plain = model(images)
        full = model(images, valid_shapes=[IMAGE, IMAGE])
    assert all(torch.equal(a, b) for a, b in zip(plain, full))


def test_registered_regions_apply_to_their_tensor_only():
    torch.manual_seed(0)
    model = SOFT(arch=SOFT_ARCH).eval()
    image = torch.randn(1, 3, *IMAGE)
    batch, shapes = _padded_batch(image, (96, 128), (96, 80), 0)
    register_valid_shapes(batch, shapes)
    with torch.no_grad():
        explicit = model(batch, valid_shapes=shapes)
        registered = model(batch)
        copied = model(batch.clone())
        unaware = model(batch.clone(), valid_shapes=[(96, 128), (96, 128)])
    assert all(torch.equal(a, b) for a, b in zip(explicit, registered))
    assert all(torch.equal(a, b) for a, b in zip(unaware, copied))
    assert not torch.allclose(explicit[0], copied[0])


def test_gradients_flow_with_regions():
    torch.manual_seed(0)
    model = SOFT(arch=SOFT_ARCH, max_bottleneck_tokens=12).train()
    image = torch.randn(1, 3, *IMAGE)
    batch, shapes = _padded_batch(image, (96, 128), (96, 80), 0)
    sum(out.sum() for out in model(batch, valid_shapes=shapes)).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize('shapes, message', [
    ([(64, 96)], 'has 1 entries; expected one'),
    ([(64, 96), (97, 10)], r'0 < h <= 96 and 0 < w <= 128'),
])
def test_bad_valid_shapes_raise(shapes, message):
    model = SOFT(arch=SOFT_ARCH)
    with pytest.raises(ValueError, match=message):
        model(torch.zeros(2, 3, 96, 128), valid_shapes=shapes)


# --------------------------------------------------------------------------
# Through mmdet's and mmseg's models built from the demo configs
# --------------------------------------------------------------------------
def _demo_model(config, scope):
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope(scope)
    cfg = Config.fromfile(config)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.eval()


def _pipeline_outputs(sample_cls, images, image_key):
    """Preprocessor input: uint8 images and samples with their img_shape."""
    samples = []
    for image in images:
        sample = sample_cls()
        sample.set_metainfo({image_key: tuple(image.shape[-2:]),
                             'ori_shape': tuple(image.shape[-2:])})
        samples.append(sample)
    return dict(inputs=list(images), data_samples=samples)


@pytest.mark.parametrize('config, scope', [
    ('configs/demo/mask-rcnn_soft-tiny_fpn_demo.py', 'mmdet'),
    ('configs/demo/upernet_soft-tiny_demo.py', 'mmseg'),
])
@pytest.mark.mmcv_ops  # builds the demo detector and segmentor
def test_demo_models_pass_valid_regions(repo_root, config, scope):
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample as sample_cls
    else:
        from mmseg.structures import SegDataSample as sample_cls
    # mmdet pads a test batch to its largest image (rounded up to 32);
    # mmseg pads a training batch to the crop size (160x160).
    training = scope == 'mmseg'
    torch.manual_seed(0)
    model = _demo_model(f'{repo_root}/{config}', scope)
    first = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8)
    second = torch.randint(0, 256, (3, 96, 80), dtype=torch.uint8)
    with torch.no_grad():
        batch = model.data_preprocessor(
            _pipeline_outputs(sample_cls, [first, second], 'img_shape'), training)
        inputs = batch['inputs']
        alone = model.data_preprocessor(
            _pipeline_outputs(sample_cls, [first], 'img_shape'), training)['inputs']
        assert tuple(inputs.shape[-2:]) != (64, 96)  # padded
        feats = model.extract_feat(inputs)  # the detectors' own call
        expected = model.backbone(inputs.clone(), valid_shapes=[(64, 96), (96, 80)])
        feats_alone = model.backbone(alone[..., :64, :96].contiguous())
    neck_feats = model.neck(expected) if model.with_neck else expected
    assert all(torch.equal(a, b) for a, b in zip(feats, neck_feats))
    for ref, out in zip(feats_alone, expected):
        height, width = ref.shape[-2:]
        assert (out[0, :, :height, :width] - ref[0]).abs().max() < 1e-4
