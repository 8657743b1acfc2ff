#!/usr/bin/env bash
# Creates .venv/ (when missing) and installs the pinned OpenMMLab stack and
# mmsoft in editable mode. Idempotent: a second run only verifies.
#
# Usage: bash tools/install_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"

source tools/venv.sh
ensure_venv "$VENV" install
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

echo "[install] build requirements (torch 2.14.1 + torchvision 0.29.1, ~5.5 GB the first time; setuptools<82, ninja)"
"${PIP[@]}" -r requirements/build.txt
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")

# mmcv's compiled ops are linked against one torch: its wheel is kept per torch
# version (not in pip's own cache, which keys a wheel by the sdist only and
# would hand a build for another torch to this one).
MMCV_WHEELS="${MMSOFT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft/wheels}/torch-$TORCH_VERSION"
MMCV_STAMP="$VENV/.mmcv-built-for-torch"
if [ "$(cat "$MMCV_STAMP" 2>/dev/null)" != "$TORCH_VERSION" ] || \
        ! "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" 2>/dev/null; then
    if ! ls "$MMCV_WHEELS"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
        echo "[install] building mmcv 2.1.0 with its ops from source against torch $TORCH_VERSION" \
             "(20-40 min on 2 cores; kept in $MMCV_WHEELS afterwards)"
        bash tools/build_mmcv_wheel.sh "$PY" "$MMCV_WHEELS"
    fi
    MMCV_WHEEL=$(ls "$MMCV_WHEELS"/mmcv-2.1.0-*.whl)
    "${PIP[@]}" --force-reinstall --no-deps "$MMCV_WHEEL"
    "${PIP[@]}" "$MMCV_WHEEL"  # its dependencies (mmengine, opencv, ...)
    "$PY" -c "import mmcv.ops" || {
        echo "[install] mmcv was installed without its compiled ops" >&2; exit 1; }
    echo "$TORCH_VERSION" > "$MMCV_STAMP"
fi

echo "[install] OpenMMLab runtime (mmengine, mmdet, mmsegmentation, pycocotools), onnx, onnxruntime, openmim"
"${PIP[@]}" -r requirements/runtime.txt -r requirements/tests.txt -r requirements/deploy.txt \
    -r requirements/mim.txt
echo "[install] mmsoft (editable)"
"${PIP[@]}" --no-build-isolation --no-deps -e .
link_package_for_mim "$VENV"
"$PY" -c "import mmsoft, mmdet, mmseg, mmcv.ops; print('[install] ok: mmsoft', mmsoft.__version__)"
