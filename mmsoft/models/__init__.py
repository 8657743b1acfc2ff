"""Models: backbones, their layers and classification heads."""
from .backbones import *  # noqa: F401,F403
