"""Models: the backbones and their layers, and the data preprocessors that
tell the backbones each image's valid region."""
from .backbones import *  # noqa: F401,F403
from .data_preprocessors import *  # noqa: F401,F403
