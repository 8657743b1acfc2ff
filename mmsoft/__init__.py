"""mmsoft: softmax-free linear-complexity vision transformers for OpenMMLab.

Importing the package registers the backbones in mmengine's root ``MODELS``
registry, where both mmdet (``default_scope='mmdet'``) and mmseg
(``default_scope='mmseg'``) configs find them.
"""
from .models import *  # noqa: F401,F403
from .version import __version__

__all__ = ['__version__']
