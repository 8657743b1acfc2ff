"""The torch releases mmsoft is tested on.

mmsoft is tested on torch 2.1 to 2.15 and sets no ceiling; ``import mmsoft``
warns once on a torch outside that range. The torch APIs the models need
that are newer than 2.1 are detected in :mod:`mmsoft.models.common`.
"""
import warnings
from typing import Optional, Tuple

import torch

#: Oldest and newest torch (major, minor) that the test suite runs on.
SUPPORTED_TORCH = ((2, 1), (2, 15))


def torch_version(version: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of ``version``, e.g. ``'2.1.2+cu121'``, or of the torch."""
    major, minor = (version or torch.__version__).split('+')[0].split('.')[:2]
    return int(major), int(''.join(ch for ch in minor if ch.isdigit()) or 0)


TORCH_VERSION = torch_version()


class UntestedTorchWarning(UserWarning):
    """The installed torch lies outside the range mmsoft is tested on."""


def warn_if_untested_torch(version: Optional[str] = None) -> bool:
    """Warns, and returns True, when ``version`` (default: the installed
    torch) lies outside :data:`SUPPORTED_TORCH`."""
    floor, ceiling = SUPPORTED_TORCH
    if floor <= torch_version(version) <= ceiling:
        return False
    warnings.warn(
        f'mmsoft is tested on torch {floor[0]}.{floor[1]} to '
        f'{ceiling[0]}.{ceiling[1]}; the installed torch is '
        f'{version or torch.__version__}. It may work; if something fails, '
        'a torch in the tested range is the first thing to try.',
        UntestedTorchWarning, stacklevel=2)
    return True
