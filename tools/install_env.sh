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

echo "[install] build requirements (torch CPU wheel, setuptools<82, ninja)"
"${PIP[@]}" -r requirements/build.txt

if ! "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" 2>/dev/null; then
    echo "[install] building mmcv 2.1.0 with its ops from source" \
         "(20-40 min on 2 cores the first time; cached by pip afterwards)"
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "${PIP[@]}" --no-build-isolation -r requirements/mmcv.txt
    "$PY" -c "import mmcv.ops" || {
        echo "[install] mmcv was installed without its compiled ops" >&2; exit 1; }
fi

echo "[install] OpenMMLab runtime (mmengine, mmdet, mmsegmentation, pycocotools), onnx, onnxruntime, openmim"
"${PIP[@]}" -r requirements/runtime.txt -r requirements/tests.txt -r requirements/deploy.txt \
    -r requirements/mim.txt
echo "[install] mmsoft (editable)"
"${PIP[@]}" --no-build-isolation --no-deps -e .
"$PY" -c "import mmsoft, mmdet, mmseg, mmcv.ops; print('[install] ok: mmsoft', mmsoft.__version__)"
