"""Models: the backbones and their layers."""
from .backbones import *  # noqa: F401,F403
