"""segmentation-models-pytorch's own encoder and model tests (vendored under
tests/) on the ``tu-`` names of SOFT++ and UFO-ViT: one class per name, as
smp's tests/encoders/test_timm_universal.py and tests/models/test_upernet.py
subclass them.

What the models do not support is declared as smp declares it: no dilation
(``supports_dilated = False``: ``output_stride`` raises a ``ValueError``)
and no scripting (``_is_torch_scriptable = False``: ``torch.jit.script``
raises). The tests check both.
"""
from .tests.encoders import base as encoders
from .tests.models import base as models


class _MmsoftEncoderTester(encoders.BaseEncoderTester):
    """smp's encoder tests on ``encoder_names``: maps at strides 4 to 32 (smp
    adds the input and an empty stride-2 map), no dilation, no scripting."""

    __test__ = False  # the subclasses below are the tests
    num_output_features = 6
    supports_dilated = False

    def get_tiny_encoder(self):
        encoder = super().get_tiny_encoder()
        encoder._is_torch_scriptable = False
        return encoder


class _MmsoftUperNetTester(models.BaseModelTester):
    """smp's model tests of UPerNet on ``test_encoder_name``; a batch of 2,
    as smp's test_upernet.py (its pooling module has BatchNorm at 1x1)."""

    __test__ = False  # the subclasses below are the tests
    test_model_type = 'upernet'
    default_batch_size = 2

    def get_default_model(self):
        model = super().get_default_model()
        model._is_torch_scriptable = False
        return model


def _encoder_test(name: str) -> type:
    return type(f'TestEncoder_{name}', (_MmsoftEncoderTester, ),
                dict(__test__=True, model_name=name, encoder_names=[f'tu-{name}']))


def _upernet_test(name: str) -> type:
    return type(f'TestUperNet_{name}', (_MmsoftUperNetTester, ),
                dict(__test__=True, model_name=name, test_encoder_name=f'tu-{name}'))


TestEncoder_soft_plus_plus_tiny = _encoder_test('soft_plus_plus_tiny')
TestEncoder_ufo_vit_tiny = _encoder_test('ufo_vit_tiny')
TestUperNet_soft_plus_plus_tiny = _upernet_test('soft_plus_plus_tiny')
TestUperNet_ufo_vit_tiny = _upernet_test('ufo_vit_tiny')
