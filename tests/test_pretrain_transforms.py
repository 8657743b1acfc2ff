"""The pre-training transforms and losses against their definitions.

Every RandAugment operation is applied to a small known image and compared
with its output computed directly from the operation's definition in numpy;
the transforms, the batch augmentation options, the losses and the metric are
checked through their mmpretrain-named arguments.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import MODELS, TRANSFORMS, DefaultScope

import mmsoft.pretrain  # noqa: F401  (registers the transforms)


def build_in_mmengine_scope(registry, cfg: dict):
    """Builds ``cfg`` as the pre-training configs do (``default_scope=
    'mmengine'``), whatever scope earlier tests left current: mmdet and mmseg
    have their own ``RandAugment`` and ``CrossEntropyLoss``."""
    with DefaultScope.overwrite_default_scope('mmengine'):
        return registry.build(cfg)
from mmsoft.models.layers import GlobalSoftmaxAttention
from mmsoft.pretrain import (Accuracy, LabelSmoothLoss, PackInputs, RandAugment,
                             RandomErasing, RandomResizedCrop, ResizeEdge)
from mmsoft.pretrain.batch_augments import mix_options

PAD_BGR = (11, 22, 33)
#: 8x8 RGB test image: distinct, spread-out values in every channel.
RGB = ((np.arange(8 * 8 * 3).reshape(8, 8, 3) * 37 + 5) % 256).astype(np.uint8)


def augment(**hparams) -> RandAugment:
    """All timm operations, nearest-neighbour warps, distinct BGR padding."""
    return RandAugment('timm_increasing', num_policies=1, magnitude_level=10,
                       hparams=dict(pad_val=PAD_BGR, interpolation='nearest',
                                    **hparams))


def apply_rgb(name: str, magnitude: float, seed: int = 0) -> np.ndarray:
    """``name`` at ``magnitude`` (of 10) on :data:`RGB`, through the BGR interface."""
    np.random.seed(seed)
    out = augment().apply(np.ascontiguousarray(RGB[..., ::-1]), [(name, magnitude)])
    return out[..., ::-1]


def first_sign(seed: int) -> float:
    """The random sign an operation draws first after ``np.random.seed(seed)``."""
    np.random.seed(seed)
    return -1. if np.random.rand() < 0.5 else 1.


def blend(degenerate: np.ndarray, factor: float) -> np.ndarray:
    """PIL's enhancement: ``degenerate + factor * (image - degenerate)``, uint8."""
    out = degenerate + factor * (RGB.astype(np.float64) - degenerate)
    return np.clip(out, 0, 255)


def affine_nearest(matrix, fill=PAD_BGR[::-1]) -> np.ndarray:
    """Output pixel centre (x, y) reads the input at floor(ax + by + c, dx + ey + f)."""
    a, b, c, d, e, f = matrix
    out = np.empty_like(RGB)
    for row in range(8):
        for col in range(8):
            x, y = col + 0.5, row + 0.5
            src_x, src_y = math.floor(a * x + b * y + c), math.floor(d * x + e * y + f)
            inside = 0 <= src_x < 8 and 0 <= src_y < 8
            out[row, col] = RGB[src_y, src_x] if inside else fill
    return out


# ------------------------------------------------- RandAugment: pixel ops ---
def test_invert_solarize_posterize():
    assert np.array_equal(apply_rgb('Invert', 10), 255 - RGB)
    for magnitude in (3, 7, 10):
        threshold = 256 - int(magnitude / 10 * 256)
        expected = np.where(RGB >= threshold, 255 - RGB, RGB)
        assert np.array_equal(apply_rgb('SolarizeIncreasing', magnitude), expected)
        add = int(magnitude / 10 * 110)
        expected = np.where(RGB < 128, np.minimum(RGB.astype(int) + add, 255), RGB)
        assert np.array_equal(apply_rgb('SolarizeAdd', magnitude), expected)
        bits = 4 - int(magnitude / 10 * 4)
        mask = (0xFF << (8 - bits)) & 0xFF
        assert np.array_equal(apply_rgb('PosterizeIncreasing', magnitude), RGB & mask)


def test_autocontrast_stretches_each_channel():
    low = (RGB // 4 + 40).astype(np.uint8)  # channels within [40, 103]
    np.random.seed(0)
    out = augment().apply(np.ascontiguousarray(low[..., ::-1]),
                          [('AutoContrast', 5)])[..., ::-1]
    lo, hi = low.min(axis=(0, 1)), low.max(axis=(0, 1))
    expected = (low - lo) * (255 / (hi - lo))
    assert np.abs(out - expected).max() <= 1
    assert (out.min(axis=(0, 1)) == 0).all() and (out.max(axis=(0, 1)) >= 254).all()


def test_equalize_matches_pil_histogram_definition():
    expected = np.empty_like(RGB)
    for channel in range(3):
        values = RGB[..., channel]
        hist = np.bincount(values.ravel(), minlength=256)
        step = (hist.sum() - hist[np.flatnonzero(hist)[-1]]) // 255
        cumulative = np.concatenate(([0], np.cumsum(hist)[:-1]))
        lut = np.minimum((step // 2 + cumulative) // step, 255) if step else \
            np.arange(256)
        expected[..., channel] = lut[values]
    assert np.array_equal(apply_rgb('Equalize', 10), expected)


@pytest.mark.parametrize('seed', [0, 1])
def test_brightness_contrast_color(seed):
    factor = 1 + first_sign(seed) * 0.9 * 0.6  # magnitude 6
    out = apply_rgb('BrightnessIncreasing', 6, seed)
    assert np.abs(out - blend(np.zeros(3), factor)).max() <= 1
    gray = RGB @ np.array([0.299, 0.587, 0.114])  # (8, 8), ITU-R 601-2 luma
    out = apply_rgb('ContrastIncreasing', 6, seed)
    assert np.abs(out - blend(np.full(3, int(gray.mean() + 0.5)), factor)).max() <= 1
    out = apply_rgb('ColorIncreasing', 6, seed)
    assert np.abs(out - blend(gray[..., None], factor)).max() <= 1.5


@pytest.mark.parametrize('seed', [0, 1])
def test_sharpness(seed):
    factor = 1 + first_sign(seed) * 0.9 * 0.6
    smooth = RGB.astype(np.float64)  # border pixels are kept
    padded = RGB.astype(np.float64)
    kernel = np.ones((3, 3))
    kernel[1, 1] = 5
    for row in range(1, 7):
        for col in range(1, 7):
            window = padded[row - 1:row + 2, col - 1:col + 2]
            smooth[row, col] = (window * kernel[..., None]).sum((0, 1)) / 13
    out = apply_rgb('SharpnessIncreasing', 6, seed)
    assert np.abs(out - blend(np.round(smooth), factor)).max() <= 1


def test_enhancement_factor_has_a_floor():
    seed = next(s for s in range(10) if first_sign(s) < 0)
    # 1 - 0.9 * 10 / 10 is raised to the least factor, 0.1.
    out = apply_rgb('BrightnessIncreasing', 10, seed)
    assert np.abs(out - blend(np.zeros(3), 0.1)).max() <= 1


# -------------------------------------------- RandAugment: geometric ops ---
@pytest.mark.parametrize('seed', [0, 1])
def test_shear_and_translate(seed):
    sign = first_sign(seed)
    shear = sign * 0.3 * 0.5  # magnitude 5
    assert np.array_equal(apply_rgb('ShearX', 5, seed),
                          affine_nearest((1, shear, 0, 0, 1, 0)))
    assert np.array_equal(apply_rgb('ShearY', 5, seed),
                          affine_nearest((1, 0, 0, shear, 1, 0)))
    shift = sign * 0.45 * 8  # magnitude 10, in pixels of the 8-pixel side
    out = apply_rgb('TranslateXRel', 10, seed)
    assert np.array_equal(out, affine_nearest((1, 0, shift, 0, 1, 0)))
    uncovered = out[:, 4:] if sign > 0 else out[:, :4]
    assert (uncovered == PAD_BGR[::-1]).all()  # pad_val is in BGR order
    assert np.array_equal(apply_rgb('TranslateYRel', 10, seed),
                          affine_nearest((1, 0, 0, 0, 1, shift)))


@pytest.mark.parametrize('seed', [0, 1])
def test_rotate_about_the_centre(seed):
    angle = math.radians(first_sign(seed) * 30 * 0.5)  # counter-clockwise
    cos, sin = math.cos(angle), math.sin(angle)
    # Output pixel p reads the input at centre + R (p - centre), with x right,
    # y down and R = [[cos, -sin], [sin, cos]]; the centre is (4, 4).
    a, b, d, e = cos, -sin, sin, cos
    matrix = (a, b, 4 - 4 * a - 4 * b, d, e, 4 - 4 * d - 4 * e)
    assert np.array_equal(apply_rgb('Rotate', 5, seed), affine_nearest(matrix))


# ------------------------------------------------ RandAugment: arguments ---
def test_rand_augment_arguments():
    np.random.seed(0)
    fixed = augment(prob=1.0)
    fixed.num_policies = 3
    assert [m for _, m in fixed.sample()] == [10., 10., 10.]
    spread = RandAugment('simple_increasing', num_policies=50, magnitude_level=6,
                         magnitude_std='inf', hparams=dict(prob=1.0))
    chosen = spread.sample()
    assert {name for name, _ in chosen} <= {'AutoContrast', 'Equalize', 'Rotate',
                                            'ShearX', 'ShearY'}
    assert all(0 <= m <= 6 for _, m in chosen) and len(chosen) == 50
    never = RandAugment(['Invert'], num_policies=2, magnitude_level=9,
                        hparams=dict(prob=0.))
    assert never.sample() == []
    img = np.ascontiguousarray(RGB[..., ::-1])
    once = RandAugment(['Invert'], num_policies=1, magnitude_level=9,
                       hparams=dict(prob=1.0))
    assert np.array_equal(once(dict(img=img.copy()))['img'], 255 - img)
    built = build_in_mmengine_scope(TRANSFORMS, dict(
        type='RandAugment', policies='timm_increasing', num_policies=2,
        total_level=10, magnitude_level=9, magnitude_std=0.5,
        hparams=dict(pad_val=[104, 116, 124])))
    assert len(built.policies) == 15 and built.prob == 0.5
    with pytest.raises(ValueError, match='policy dicts are not supported'):
        RandAugment([dict(type='Rotate')], num_policies=1, magnitude_level=1)
    with pytest.raises(ValueError, match=r"hparams keys \['fill'\]"):
        RandAugment('timm_increasing', 1, 1, hparams=dict(fill=1))
    with pytest.raises(ValueError, match='magnitude_level=11'):
        RandAugment('timm_increasing', 1, 11)


# ------------------------------------------------------ other transforms ---
def test_random_resized_crop_arguments():
    np.random.seed(0)
    img = np.random.randint(0, 256, (20, 20, 3), dtype=np.uint8)
    crop = RandomResizedCrop(scale=10, crop_ratio_range=(0.25, 0.25),
                             aspect_ratio_range=(1., 1.), interpolation='nearest')
    out = crop(dict(img=img))
    assert out['img_shape'] == (10, 10)
    assert any(np.array_equal(out['img'], img[t:t + 10, l:l + 10])
               for t in range(11) for l in range(11))
    wide = np.random.randint(0, 256, (20, 40, 3), dtype=np.uint8)
    centred = RandomResizedCrop(scale=(20, 20), aspect_ratio_range=(1., 1.),
                                max_attempts=0, interpolation='nearest')
    assert np.array_equal(centred(dict(img=wide))['img'], wide[:, 10:30])
    pillow = RandomResizedCrop(scale=(6, 9), backend='pillow', interpolation='bicubic')
    assert pillow(dict(img=wide))['img'].shape == (6, 9, 3)
    with pytest.raises(ValueError, match="interpolation .backend='pillow'.='area'"):
        RandomResizedCrop(8, backend='pillow', interpolation='area')
    with pytest.raises(ValueError, match='crop_ratio_range'):
        RandomResizedCrop(8, crop_ratio_range=(0.5, 0.2))


def test_resize_edge_arguments():
    img = np.zeros((40, 60, 3), dtype=np.uint8)
    for edge, scale in (('short', 20), ('long', 30), ('width', 30), ('height', 20)):
        out = ResizeEdge(scale, edge=edge)(dict(img=img.copy()))
        assert out['img'].shape == (20, 30, 3) and out['scale'] == (30, 20), edge
        assert out['scale_factor'] == (0.5, 0.5)
    # The other side is rounded: 10 * 4 / 7 = 5.71 -> 6.
    assert ResizeEdge(4)(dict(img=np.zeros((7, 10, 3), np.uint8)))['img'].shape == \
        (4, 6, 3)
    with pytest.raises(ValueError, match="edge='diagonal'"):
        ResizeEdge(4, edge='diagonal')


def test_random_erasing_arguments():
    np.random.seed(0)
    img = np.zeros((20, 30, 3), dtype=np.uint8)
    erase = RandomErasing(erase_prob=1., min_area_ratio=0.1, max_area_ratio=0.2,
                          aspect_range=0.5, mode='const', fill_color=(1, 2, 3))
    assert erase.aspect_range == (0.5, 2.0)
    for _ in range(5):
        out = erase(dict(img=img.copy()))['img']
        rows, cols = np.nonzero(out.any(axis=-1))
        box = out[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert (box == (1, 2, 3)).all()  # one filled rectangle
        assert 0.1 * 600 * 0.8 <= box.shape[0] * box.shape[1] <= 0.2 * 600 * 1.2
    assert not RandomErasing(erase_prob=0.)(dict(img=img.copy()))['img'].any()
    noise = RandomErasing(erase_prob=1., min_area_ratio=0.9, max_area_ratio=0.9,
                          aspect_range=(1., 1.), mode='rand', fill_color=(50, 100, 200),
                          fill_std=(0., 0., 0.))
    out = noise(dict(img=np.zeros((40, 40, 3), np.uint8)))['img']
    assert (out[out.any(axis=-1)] == (50, 100, 200)).all()
    with pytest.raises(ValueError, match="mode='pixel'"):
        RandomErasing(mode='pixel')


def test_pack_inputs_arguments():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    packed = PackInputs()(dict(img=img, gt_label=2, img_path='a.png', sample_idx=7,
                               flip_direction=None, extra=1))
    assert torch.equal(packed['inputs'], torch.from_numpy(img).permute(2, 0, 1))
    assert packed['data_samples'].gt_label.tolist() == [2]
    assert packed['data_samples'].metainfo == dict(img_path='a.png', sample_idx=7,
                                                   flip_direction=None)
    other = PackInputs(input_key='image', meta_keys=('extra', ))(dict(image=img,
                                                                     extra=1))
    assert other['data_samples'].metainfo == dict(extra=1)
    with pytest.raises(ValueError, match='algorithm_keys'):
        PackInputs(algorithm_keys=('mask', ))


# ---------------------------------------- batch augments, losses, metric ---
def test_batch_augment_options():
    deit = mix_options([dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)])
    assert deit == dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, prob=1.0)
    partial = mix_options([dict(type='CutMix', alpha=1.0),
                           dict(type='Mixup', alpha=0.2)], probs=[0.6, 0.2])
    assert partial['switch_prob'] == pytest.approx(0.75)
    assert partial['prob'] == pytest.approx(0.8)
    for bad in ([dict(type='Mosaic', alpha=1.)], [dict(type='Mixup', alpha=1.)] * 2,
                [dict(type='CutMix', alpha=1., correct_lam=False)]):
        with pytest.raises(ValueError):
            mix_options(bad)
    with pytest.raises(ValueError, match='num_classes=None'):
        build_in_mmengine_scope(MODELS, dict(
            type='ClsDataPreprocessor',
            batch_augments=dict(augments=[dict(type='Mixup', alpha=0.8)])))


def test_label_smooth_loss_and_accuracy():
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    loss = LabelSmoothLoss(label_smooth_val=0.1, mode='original', loss_weight=2.)
    expected = F.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.allclose(loss(logits, labels), 2 * expected)
    plain = build_in_mmengine_scope(
        MODELS, dict(type='CrossEntropyLoss', use_soft=True, reduction='none'))
    assert torch.allclose(plain(logits, F.one_hot(labels, 5).float()),
                          F.cross_entropy(logits, labels, reduction='none'))
    with pytest.raises(ValueError, match="mode='classy_vision'"):
        LabelSmoothLoss(0.1, mode='classy_vision')
    metric = Accuracy(topk=(1, 2))
    scores = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.1, 0.4], [0.1, 0.3, 0.6]])
    metric.process(None, [dict(pred_score=s, gt_label=torch.tensor([g]))
                          for s, g in zip(scores, (0, 2, 1))])
    assert metric.compute_metrics(metric.results) == dict(
        top1=pytest.approx(100 / 3), top2=pytest.approx(100.))


def test_class_attention_is_softmax_attention_of_the_class_token():
    torch.manual_seed(0)
    attention = GlobalSoftmaxAttention(embed_dims=8, num_heads=2)
    x = torch.randn(2, 5, 8)
    query = attention.q(x[:, :1]).reshape(2, 1, 2, 4).transpose(1, 2)
    keys, values = attention.kv(x).reshape(2, 5, 2, 2, 4).permute(2, 0, 3, 1, 4)
    weights = (query @ keys.transpose(-2, -1) / 2).softmax(-1)  # (B, h, 1, 5)
    expected = attention.proj((weights @ values).transpose(1, 2).reshape(2, 1, 8))
    assert torch.allclose(attention(x, num_queries=1), expected, atol=1e-6)
    assert sorted(attention.state_dict()) == ['kv.bias', 'kv.weight', 'proj.bias',
                                              'proj.weight', 'q.bias', 'q.weight']
