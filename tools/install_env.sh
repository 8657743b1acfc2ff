#!/usr/bin/env bash
# Creates .venv/ (when missing) and installs the locked OpenMMLab stack
# (requirements/locks/stack.txt), mmcv with its ops (its wheel cached:
# docs/get_started.md) and mmsoft in editable mode; a second run only verifies.
#
# Usage: bash tools/install_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
TAG=install
# shellcheck source=tools/install_common.sh
source tools/install_common.sh

prepare_env "$TAG" stack "$VENV" python3
install_locked "$TAG" "$VENV" requirements/locks/stack.txt

KEY=$(bash tools/build_mmcv_wheel.sh key "$PY")
MMCV_WHEELS="${MMSOFT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft/wheels}/$KEY"
if ls "$MMCV_WHEELS"/mmcv-*.whl >/dev/null 2>&1; then
    echo "[$TAG] mmcv wheel for this torch and build script found in $MMCV_WHEELS"
    bash tools/build_mmcv_wheel.sh prepare "$PY"
else
    echo "[$TAG] building mmcv with its ops from source against torch" \
         "$("$PY" -c "import torch; print(torch.__version__)") (kept in $MMCV_WHEELS afterwards)"
    bash tools/build_mmcv_wheel.sh build "$PY" "$MMCV_WHEELS"
fi
MMCV_WHEEL=$(ls "$MMCV_WHEELS"/mmcv-*.whl)
MMCV_STAMP="$VENV/.mmcv-wheel"
if [ "$(cat "$MMCV_STAMP" 2>/dev/null)" != "$MMCV_WHEEL" ] || \
        ! "$PY" -c "import mmcv.ops" 2>/dev/null; then
    run_step "$TAG" "installing $(basename "$MMCV_WHEEL")" mmcv \
        "$PY" -m pip install --disable-pip-version-check --force-reinstall \
        --no-deps "$MMCV_WHEEL"
    "$PY" -c "import mmcv.ops" || {
        echo "[$TAG] mmcv was installed without its compiled ops ($MMCV_WHEEL)" >&2; exit 1; }
    echo "$MMCV_WHEEL" > "$MMCV_STAMP"
fi

install_editable "$TAG" "$VENV"
# mim reads site-packages/mmsoft/.mim: a link to the checkout's package, in
# the install's RECORD (docs/training.md).
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -e "$SITE/mmsoft" ] && [ ! -L "$SITE/mmsoft" ]; then
    echo "[mim] $SITE/mmsoft is not a link (a regular install?): left as it is" >&2
else
    ln -sfn "$(pwd)/mmsoft" "$SITE/mmsoft"
    RECORD=$(ls "$SITE"/mmsoft-*.dist-info/RECORD)
    grep -qx 'mmsoft,,' "$RECORD" || echo 'mmsoft,,' >> "$RECORD"
fi
run_step "$TAG" "checking that every installed package's requirements hold (pip check)" \
    "the locked stack" "$PY" -m pip check
"$PY" -c "import mmsoft, mmdet, mmseg, mmcv.ops; print('[$TAG] ok: mmsoft', mmsoft.__version__)"
