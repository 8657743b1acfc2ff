"""Each model's ``forward_intermediates`` runs the network once and stops
early when asked; ``prune_intermediate_layers`` cuts SOFT's stages and
UFO-ViT's blocks off. Counted with forward hooks on the blocks."""
import pytest
import torch

from mmsoft.models import SOFT, UFOViT
from mmsoft.models.soft import SoftStage

SMALL_SOFT = dict(embed_dims=[16, 32, 64, 64], num_heads=[1, 2, 2, 2],
                  depths=[1, 2, 1, 2])
SMALL_UFO = dict(embed_dims=32, depth=8, num_heads=2)


def build(name, **kwargs):
    torch.manual_seed(0)
    if name == 'soft':
        return SOFT(SMALL_SOFT, num_classes=3, drop_path_rate=0., **kwargs).eval()
    return UFOViT(SMALL_UFO, num_classes=3, global_pool='token', drop_path_rate=0.,
                  **kwargs).eval()


def blocks_of(model):
    """The model's blocks in order, class-attention blocks left out."""
    if isinstance(model, SOFT):
        return [block for stage in model.stages for block in stage.blocks]
    return list(model.blocks)


def count_block_calls(model):
    """Per-block call counts, updated by forward hooks."""
    calls = [0] * len(blocks_of(model))
    for index, block in enumerate(blocks_of(model)):
        block.register_forward_hook(
            lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    return calls


def images():
    return torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize('name', ['soft', 'ufo'])
def test_one_pass_gives_the_tokens_and_the_maps(name):
    model = build(name)
    calls = count_block_calls(model)
    with torch.no_grad():
        tokens, maps = model.forward_intermediates(images())
    assert calls == [1] * len(calls)
    with torch.no_grad():
        torch.testing.assert_close(tokens, model.forward_features(images()))
        expected = model.forward_intermediates(images(), intermediates_only=True)
    for feat, reference in zip(maps, expected):
        torch.testing.assert_close(feat, reference)


@pytest.mark.parametrize('name,indices,ran', [
    # SOFT: blocks 1, 2, 1, 2 per stage; UFO-ViT: outputs after blocks 2, 4, 6, 8.
    ('soft', [0], 1), ('soft', [0, 1], 3), ('soft', [2], 4), ('soft', 4, 6),
    ('ufo', [0], 2), ('ufo', [1], 4), ('ufo', [0, 2], 6), ('ufo', 1, 8)])
def test_stop_early_runs_the_blocks_up_to_the_last_output(name, indices, ran):
    model = build(name)
    calls = count_block_calls(model)
    with torch.no_grad():
        tokens, early = model.forward_intermediates(images(), indices, stop_early=True)
    assert calls == [1] * ran + [0] * (len(calls) - ran)
    calls[:] = [0] * len(calls)
    with torch.no_grad():
        _, full = model.forward_intermediates(images(), indices, stop_early=False)
    assert calls == [1] * len(calls)
    assert len(early) == len(full)
    for feat, reference in zip(early, full):
        torch.testing.assert_close(feat, reference)


@pytest.mark.parametrize('name', ['soft', 'ufo'])
def test_intermediates_only_stops_at_the_last_output(name):
    model = build(name)
    calls = count_block_calls(model)
    with torch.no_grad():
        model.forward_intermediates(images(), [0], intermediates_only=True)
    assert sum(calls) == (1 if name == 'soft' else 2)


def test_soft_has_one_module_per_stage():
    model = build('soft')
    assert [type(stage) for stage in model.stages] == [SoftStage] * 4
    stage = model.stages[3]
    assert {name.split('.')[0] for name, _ in stage.named_parameters()} == {
        'patch_embed', 'pos_embed', 'cls_token', 'blocks', 'norm'}
    assert not hasattr(model.stages[0], 'cls_token')
    assert model.no_weight_decay() == {f'stages.{i}.pos_embed' for i in range(4)} | {
        'stages.3.cls_token'}


@pytest.mark.parametrize('name,indices,kept_indices,kept_blocks', [
    ('soft', [0, 1], [0, 1], 3), ('soft', 3, [1, 2, 3], 6), ('ufo', [1], [1], 4),
    ('ufo', [0, 2], [0, 2], 6)])
def test_prune_cuts_what_no_kept_output_needs(name, indices, kept_indices, kept_blocks):
    model = build(name)
    with torch.no_grad():
        _, expected = model.forward_intermediates(images(), indices)
    kept = model.prune_intermediate_layers(indices)
    assert kept == kept_indices
    assert len(blocks_of(model)) == kept_blocks
    if name == 'soft':
        assert len(model.stages) == max(kept) + 1
    assert len(model.feature_info) == max(kept) + 1
    with torch.no_grad():
        maps = model.forward_intermediates(images(), kept, intermediates_only=True)
    assert len(maps) == len(expected)
    for feat, reference in zip(maps, expected):
        torch.testing.assert_close(feat, reference)
    with pytest.raises(ValueError, match='is invalid'):
        model.forward_intermediates(images(), [max(kept) + 1])
