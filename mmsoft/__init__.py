"""mmsoft: softmax-free linear-complexity vision transformers for OpenMMLab.

Importing the package registers the backbones in mmengine's root ``MODELS``
registry, where both mmdet (``default_scope='mmdet'``) and mmseg
(``default_scope='mmseg'``) configs find them. It also allow-lists the globals
of mmengine training checkpoints for ``torch.load(weights_only=True)``, for
the whole process, through :func:`~mmsoft.checkpoint.allow_mmengine_checkpoint_globals`
(:mod:`mmsoft.checkpoint.safe_load`).
"""
from .models import *  # noqa: F401,F403
from .checkpoint.safe_load import allow_mmengine_checkpoint_globals
from .utils.torch_compat import warn_if_untested_torch
from .version import __version__

# Once per process: Python shows a warning from this line once.
warn_if_untested_torch()

# mmengine checkpoints (message hub, numpy scalars) load with torch.load's
# default weights_only=True once their few globals are allow-listed.
allow_mmengine_checkpoint_globals()

__all__ = ['__version__']
