#!/usr/bin/env bash
# Creates the newest environment (default .venv-newest/, when missing) from
# requirements/locks/newest.txt, no OpenMMLab package, and mmsoft in editable
# mode, for `make test-newest`; a second run only verifies. Its interpreter:
# docs/testing.md.
#
# Usage: bash tools/install_newest_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-newest}"
PY="$VENV/bin/python"
TAG=install-newest
WANTED=3.12
# shellcheck source=tools/install_common.sh
source tools/install_common.sh

# find_python: the interpreter to create the environment with, on stdout.
find_python() {
    local candidate version best='' best_minor=0
    python312 && return 0
    for candidate in python3.14 python3.13 python3.11 python3.10 python3; do
        version=$("$candidate" -c 'import sys; print(sys.version_info[1])' 2>/dev/null) || continue
        if [ "$version" -ge 10 ] && [ "$version" -gt "$best_minor" ]; then
            best=$(command -v "$candidate")
            best_minor=$version
        fi
    done
    [ -n "$best" ] && echo "$best"
}

BASE_PY="$PY"
if [ ! -x "$PY" ]; then
    BASE_PY=$(find_python) || {
        echo "[$TAG] no Python 3.10 or newer found (wanted CPython $WANTED: python$WANTED" \
             "on PATH or in pyenv's versions)" >&2; exit 1; }
    BASE_VERSION=$("$BASE_PY" -c 'import platform; print(platform.python_version())')
    echo "[$TAG] CPython $BASE_VERSION ($BASE_PY)"
    [[ "$BASE_VERSION" == "$WANTED".* ]] || echo "[$TAG] CPython $WANTED not found" \
        "(neither on PATH nor in pyenv's versions): using the newest Python there;" \
        "the lock is resolved for $WANTED"
fi
prepare_env "$TAG" newest "$VENV" "$BASE_PY"
install_locked "$TAG" "$VENV" requirements/locks/newest.txt
install_editable "$TAG" "$VENV"
run_step "$TAG" "checking that every installed package's requirements hold (pip check)" \
    "the locked newest environment" "$PY" -m pip check
"$PY" - <<'PY'
import importlib.util
import platform

import segmentation_models_pytorch
import timm
import torch
import torchvision
import transformers
from torchvision.ops import nms

import mmsoft

present = [name for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain')
           if importlib.util.find_spec(name) is not None]
assert not present, f'the newest environment should hold no OpenMMLab package: {present}'
boxes = torch.tensor([[0., 0., 2., 2.], [0., 0., 2., 2.1]])
assert nms(boxes, torch.tensor([1., .9]), .5).tolist() == [0], 'torchvision ops'
print(f'[install-newest] ok: mmsoft {mmsoft.__version__}, Python {platform.python_version()}, '
      f'torch {torch.__version__}, torchvision {torchvision.__version__}, '
      f'timm {timm.__version__}, transformers {transformers.__version__}, '
      f'smp {segmentation_models_pytorch.__version__}')
PY
