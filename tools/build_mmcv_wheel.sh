#!/usr/bin/env bash
# Builds mmcv's wheel, with its compiled ops, against the torch of a Python
# environment (no build isolation: the ops link that torch).
#
# mmcv 2.1.0's setup.py compiles its C++ ops as C++17; torch 2.14's headers
# need C++20 (`#error C++20 or later compatible compiler is required to use
# ATen`). From torch 2.14 on, the sdist's setup.py is built with the standard
# raised to C++20; on older torch it is built as published.
#
# Usage: bash tools/build_mmcv_wheel.sh PYTHON WHEEL_DIR
# Environment: MAX_JOBS (compile jobs, default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$1"
WHEEL_DIR="$2"
REQUIREMENT=$(grep -E '^mmcv==' requirements/mmcv.txt)
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT

"$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary :all: -d "$SRC" "$REQUIREMENT"
tar -xzf "$SRC"/mmcv-*.tar.gz -C "$SRC"
SETUP=$(ls "$SRC"/mmcv-*/setup.py)
if "$PY" -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 14))"; then
    echo "[build-mmcv] torch $("$PY" -c 'import torch; print(torch.__version__)') needs C++20: building the ops as C++20"
    sed -i "s/'-std=c++17'/'-std=c++20'/g" "$SETUP"
    grep -q "'-std=c++20'" "$SETUP" || {
        echo "[build-mmcv] $SETUP sets no -std=c++17 to raise" >&2; exit 1; }
fi
mkdir -p "$WHEEL_DIR"
MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    "$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --no-cache-dir -w "$WHEEL_DIR" "$(dirname "$SETUP")"
