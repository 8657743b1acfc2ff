"""mmsoft: softmax-free linear-complexity vision transformers.

The models (:mod:`mmsoft.models`) need only PyTorch. Importing the package
also registers them with the frameworks that are installed: timm's model
registry (:mod:`mmsoft.timm_models`) when timm is, mmengine's ``MODELS``
registry (:mod:`mmsoft.openmmlab.registry`) when mmengine is.
"""
import importlib
import importlib.util

from .models import SOFT, UFOViT
from .utils.torch_compat import warn_if_untested_torch
from .version import __version__

# Once per process: Python shows a warning from this line once.
warn_if_untested_torch()


def _register(adapter: str, framework: str) -> None:
    """Imports ``mmsoft.<adapter>`` when ``framework`` can be found; a
    framework that is found but fails to import raises."""
    try:
        found = importlib.util.find_spec(framework) is not None
    except ImportError:  # a finder that refuses the name
        found = False
    if found:
        importlib.import_module(f'{__name__}.{adapter}')


_register('timm_models', 'timm')  # the models in timm's registry
# type='SOFT', 'UFOViT', ... in mmengine's MODELS
_register('openmmlab.registry', 'mmengine')

__all__ = ['SOFT', 'UFOViT', '__version__']
