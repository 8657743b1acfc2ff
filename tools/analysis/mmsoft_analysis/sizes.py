"""Image sizes on the command line: ``HxW`` or ``N`` (square).

Standard library only, for the tools that run without OpenMMLab or torch.
"""
import argparse
import re
from typing import Tuple

_SIZE = re.compile(r'\s*([0-9]+)\s*(?:[xX]\s*([0-9]+)\s*)?')


class SizeError(argparse.ArgumentTypeError, ValueError):
    """An invalid size: argparse shows its message; a ValueError elsewhere."""


def parse_size(text: str) -> Tuple[int, int]:
    """Reads an image size, e.g. for argparse's ``type=``.

    Args:
        text (str): ``'HxW'`` (``'800x1333'`` -> ``(800, 1333)``) or ``'N'``
            (``'64'`` -> ``(64, 64)``); whitespace and the ``x``'s case are
            ignored.

    Returns:
        tuple[int, int]: ``(height, width)``.

    Raises:
        SizeError: ``text`` is not of that form, or a side is not positive.
    """
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match:
        height = int(match[1])
        width = height if match[2] is None else int(match[2])
        if height > 0 and width > 0:
            return height, width
    raise SizeError(f'size {text!r} is invalid; expected HxW (or N for NxN), '
                    'e.g. 800x1333.')
