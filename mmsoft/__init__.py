"""mmsoft: softmax-free linear-complexity vision transformers for OpenMMLab.

Importing the package registers the backbones in mmengine's root ``MODELS``
registry, where both mmdet (``default_scope='mmdet'``) and mmseg
(``default_scope='mmseg'``) configs find them. It also allow-lists the globals
of mmengine training checkpoints for ``torch.load(weights_only=True)``
(:mod:`mmsoft.utils.checkpoint_safety`).
"""
from .models import *  # noqa: F401,F403
from .utils.checkpoint_safety import register_checkpoint_safe_globals
from .version import __version__

# mmengine checkpoints (message hub, numpy scalars) load with torch.load's
# default weights_only=True once their few globals are allow-listed.
register_checkpoint_safe_globals()

__all__ = ['__version__']
