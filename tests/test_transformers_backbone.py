"""mmsoft's models as Hugging Face transformers backbones: ``TimmBackbone``
builds them by their timm names, and DETR trains on them, with transformers
5.x (the newest environment) and 4.51 (the stack's pin). The recipes of
docs/backbones.md (DETR, UperNet, the maps under a head of one's own) run in
tests/test_readme.py; the maps equal the other adapters' in
tests/test_adapters.py."""
import pytest
import torch

transformers = pytest.importorskip('transformers')
pytest.importorskip('timm')
import mmsoft.timm_models  # noqa: E402  (registers the models with timm)

pytestmark = [pytest.mark.torchvision, pytest.mark.frameworks]

NAMES = ['soft_plus_plus_tiny', 'ufo_vit_tiny']


@pytest.mark.parametrize('name', sorted(mmsoft.timm_models.default_cfgs))
def test_default_config_gives_the_last_map(name):
    """transformers' default ``out_indices=(-1,)`` on every name, built and run
    on the meta device (shapes only; the tiny names run for real in
    transformers' own tests, tests/vendor/transformers)."""
    from transformers import TimmBackbone, TimmBackboneConfig
    with torch.device('meta'):
        backbone = TimmBackbone(TimmBackboneConfig(backbone=name,
                                                   use_pretrained_backbone=False))
        maps = backbone(torch.empty(2, 3, 64, 96)).feature_maps
    assert backbone.out_indices == [3]
    assert [tuple(m.shape) for m in maps] == [(2, backbone.channels[0], 2, 3)]


@pytest.mark.parametrize('name', NAMES)
def test_timm_backbone_gives_the_four_maps(name):
    from transformers import AutoBackbone, TimmBackboneConfig
    config = TimmBackboneConfig(backbone=name, use_pretrained_backbone=False,
                                out_indices=(0, 1, 2, 3))
    backbone = AutoBackbone.from_config(config).eval()
    with torch.no_grad():
        maps = backbone(torch.randn(2, 3, 96, 128)).feature_maps
    assert [m.shape[-2:] for m in maps] == [(24, 32), (12, 16), (6, 8), (3, 4)]
    assert [m.shape[1] for m in maps] == backbone.num_features


@pytest.mark.parametrize('name', NAMES)
def test_detr_trains_a_step(name):
    from transformers import DetrConfig, DetrForObjectDetection
    torch.manual_seed(0)
    config = DetrConfig(
        backbone_config=dict(model_type='timm_backbone', backbone=name,
                             num_channels=3, features_only=True,
                             use_pretrained_backbone=False, out_indices=[3]),
        # transformers 4.x needs use_timm_backbone=False beside backbone_config;
        # 5.x no longer has the attribute and ignores it.
        use_timm_backbone=False, use_pretrained_backbone=False, num_queries=8,
        d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_labels=3)
    model = DetrForObjectDetection(config).train()
    backbone_params = [p for n, p in model.named_parameters()
                       if 'backbone' in n and p.requires_grad]
    assert backbone_params
    labels = [dict(class_labels=torch.tensor([1, 2]),
                   boxes=torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]]))
              for _ in range(2)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    before = [p.detach().clone() for p in backbone_params]
    loss = model(pixel_values=torch.randn(2, 3, 96, 128), labels=labels).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and loss.item() > 0
    moved = sum(not torch.equal(a, p) for a, p in zip(before, backbone_params))
    assert moved > 0.9 * len(backbone_params)
