#!/usr/bin/env bash
# Creates the floor environment (default .venv-floor/, when missing) from
# requirements/locks/floor*.txt (torch 2.1.2, mmcv-lite 2.1.0) and mmsoft in
# editable mode, for `make test-floor`; a second run only verifies.
#
# Usage: bash tools/install_floor_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-floor}"
PY="$VENV/bin/python"
TAG=install-floor
# shellcheck source=tools/install_common.sh
source tools/install_common.sh

prepare_env "$TAG" floor "$VENV" python3
# mmdet and mmsegmentation without their dependencies
# (requirements/floor-nodeps.txt): all of them are in the locks.
install_locked "$TAG" "$VENV" requirements/locks/floor.txt requirements/locks/floor-nodeps.txt
install_editable "$TAG" "$VENV"
"$PY" - <<'PY'
import importlib.util

import mmcv
import numpy
import torch

import mmdet
import mmseg
import mmsoft

assert torch.__version__.startswith('2.1.'), torch.__version__
assert numpy.__version__.startswith('1.'), numpy.__version__
assert mmcv.__version__ == '2.1.0', mmcv.__version__
assert importlib.util.find_spec('mmcv._ext') is None, \
    'the floor env should hold mmcv-lite (no compiled ops)'
print(f'[install-floor] ok: mmsoft {mmsoft.__version__}, torch {torch.__version__}, '
      f'numpy {numpy.__version__}, mmcv-lite {mmcv.__version__}, '
      f'mmdet {mmdet.__version__}, mmseg {mmseg.__version__}')
PY
