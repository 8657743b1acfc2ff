"""transformers' own ``TimmBackbone`` tests (vendored under tests/) on a SOFT,
a SOFT++ and a UFO-ViT name: one test class per name and upstream class.

What does not run as upstream wrote it is listed, with the reason, in
tests/vendor/conftest.py.
"""
from .tests.models.timm_backbone import test_modeling_timm_backbone as upstream


class ModelTester(upstream.TimmBackboneModelTester):
    """Upstream's tester on ``backbone``: the last map (index 3, as upstream's
    4 is resnet18's last), random weights."""

    def __init__(self, parent, backbone: str):
        super().__init__(parent, backbone=backbone, out_indices=[3])

    def get_config(self):
        config = super().get_config()
        config.use_pretrained_backbone = False
        return config


def _model_test(name: str) -> type:
    def setUp(self):
        upstream.TimmBackboneModelTest.setUp(self)
        self.model_tester = ModelTester(self, name)
    return type(f'TimmBackboneModelTest_{name}', (upstream.TimmBackboneModelTest, ),
                dict(model_name=name, setUp=setUp))


def _integration_test(name: str) -> type:
    return type(f'TimmBackboneIntegrationTest_{name}',
                (upstream.TimmBackboneIntegrationTest, ),
                dict(model_name=name, backbone=name))


TimmBackboneModelTest_soft_tiny = _model_test('soft_tiny')
TimmBackboneModelTest_soft_plus_plus_tiny = _model_test('soft_plus_plus_tiny')
TimmBackboneModelTest_ufo_vit_tiny = _model_test('ufo_vit_tiny')
TimmBackboneIntegrationTest_soft_tiny = _integration_test('soft_tiny')
TimmBackboneIntegrationTest_soft_plus_plus_tiny = _integration_test(
    'soft_plus_plus_tiny')
TimmBackboneIntegrationTest_ufo_vit_tiny = _integration_test('ufo_vit_tiny')
