#!/usr/bin/env bash
# Creates the floor environment (default .venv-floor/, when missing): the
# lowest supported torch (2.1.2), mmcv-lite 2.1.0 (no compiled ops), mmengine,
# mmdet and mmsegmentation, and mmsoft in editable mode. Tests run there with
# `pytest tests -m "not mmcv_ops"` (`make test-floor`). Idempotent: a second
# run only verifies.
#
# Usage: bash tools/install_floor_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-floor}"
PY="$VENV/bin/python"

source tools/venv.sh
ensure_venv "$VENV" install-floor
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

# Both requirement files hold numpy>=1.26,<2, so that no pip command here can
# move numpy to 2.x under torch 2.1.
echo "[install-floor] torch 2.1.2 (CUDA build, ~2.6 GB the first time), mmcv-lite, mmengine, runtime, pytest, onnx"
"${PIP[@]}" -r requirements/floor.txt
echo "[install-floor] mmdet and mmsegmentation (--no-deps, see requirements/floor-nodeps.txt)"
"${PIP[@]}" --no-deps -r requirements/floor-nodeps.txt
echo "[install-floor] mmsoft (editable)"
"${PIP[@]}" --no-build-isolation --no-deps -e .
"$PY" - <<'PY'
import mmcv
import numpy
import torch

import mmdet
import mmseg
import mmsoft

assert torch.__version__.startswith('2.1.'), torch.__version__
assert numpy.__version__.startswith('1.'), numpy.__version__
assert mmcv.__version__ == '2.1.0', mmcv.__version__
try:
    import mmcv._ext  # noqa: F401
except ImportError:
    pass
else:
    raise AssertionError('the floor env should hold mmcv-lite (no compiled ops)')
print(f'[install-floor] ok: mmsoft {mmsoft.__version__}, torch {torch.__version__}, '
      f'numpy {numpy.__version__}, mmcv-lite {mmcv.__version__}, '
      f'mmdet {mmdet.__version__}, mmseg {mmseg.__version__}')
PY
