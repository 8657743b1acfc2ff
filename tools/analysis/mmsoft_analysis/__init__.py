"""The measuring code of ``tools/analysis/`` (its modules: docs/layout.md).

Lab code, not part of the installed ``mmsoft`` package: the tools import it
from their own folder. Importing it puts the repository root on ``sys.path``
(the comparison's configs import ``configs.comparison.peer_backbones``).
"""
import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Tuple

#: ``tools/analysis/``, the folder that holds this package.
ANALYSIS_DIR = Path(__file__).resolve().parents[1]
#: The repository root.
REPO = ANALYSIS_DIR.parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

_SIZE = re.compile(r'\s*([0-9]+)\s*(?:[xX]\s*([0-9]+)\s*)?')


class SizeError(argparse.ArgumentTypeError, ValueError):
    """An invalid size: argparse shows its message; a ValueError elsewhere."""


def parse_size(text: str) -> Tuple[int, int]:
    """``'HxW'`` (``'800x1333'`` -> ``(800, 1333)``) or ``'N'`` (square) as
    ``(height, width)``, ignoring whitespace and the ``x``'s case; SizeError
    where a side is missing or not positive."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match:
        height = int(match[1])
        width = height if match[2] is None else int(match[2])
        if height > 0 and width > 0:
            return height, width
    raise SizeError(f'size {text!r} is invalid; expected HxW (or N for NxN), '
                    'e.g. 800x1333.')


def timed(call, repeats: int, warmup: int = 1):
    """The median time of ``repeats`` calls after ``warmup``, and the last
    result."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out
