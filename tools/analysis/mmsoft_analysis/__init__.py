"""Cost analysis of mmsoft's backbones: latency and memory measurement, peer
backbones, the detector training step, batch capacity, the GPU check and the
side-by-side comparison with its reports.

Lab code, not part of the installed ``mmsoft`` package: the scripts in
``tools/analysis/`` import it from their own directory. Importing it puts the
repository root on ``sys.path`` (as ``tools/train.py`` does), so that the
comparison's peer configs import their backbones
(``configs.comparison.peer_backbones``).
"""
import os
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional

#: ``tools/analysis/``, the directory that holds this package.
ANALYSIS_DIR = Path(__file__).resolve().parents[1]
#: The repository root.
REPO = ANALYSIS_DIR.parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


def worker_command(module: str, *args: str) -> List[str]:
    """``python -m mmsoft_analysis.<module> ARGS`` in this interpreter; run it
    with :func:`worker_env`."""
    return [sys.executable, '-m', f'{__name__}.{module}', *args]


def worker_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``env`` (default: this process's environment) with ``tools/analysis/``
    first on ``PYTHONPATH``, so that a child process imports this package."""
    env = dict(os.environ if env is None else env)
    paths = [str(ANALYSIS_DIR), env.get('PYTHONPATH', '')]
    env['PYTHONPATH'] = os.pathsep.join(filter(None, paths))
    return env
