#!/usr/bin/env bash
# Writes an offline bundle for a GPU node (`make gpu-bundle`): the wheels the
# GPU check needs beyond the node's own torch, NumPy and timm
# (requirements/gpu-bundle.txt), hash-checked from their lock, plus mmsoft's
# own wheel. tools/gpu_check_offline.sh installs and runs it on the node.
#
#   bash tools/gpu_bundle.sh lock [--python-version V] [--platform P]
#       rewrites requirements/locks/gpu-bundle.txt (uv, as tools/lock.sh:
#       hashes as the index publishes them, wheels only).
#   bash tools/gpu_bundle.sh [OUT_DIR] [--python-version V] [--platform P]
#       OUT_DIR (default work_dirs/gpu_bundle) receives the locked wheels
#       (pip download --require-hashes --no-deps --only-binary :all:),
#       mmsoft's wheel, the lock (gpu-bundle-lock.txt) and SHA256SUMS, in
#       place of the wheels it held; the folder's size is printed and must
#       stay under 60 MB.
#
# Default target: CPython 3.12, manylinux_2_28_x86_64 (pip's platform tag;
# uv's form, x86_64-manylinux_2_28, is accepted too). The repository's lock
# is for the default target; for another one the lock is resolved into
# OUT_DIR only.
#
# mmsoft's wheel is built by `uv build` with the pinned build tools of
# requirements/build-constraints.txt, from a copy of the checkout (setup.py
# copies configs/ and tools/ into mmsoft/.mim while it builds).
#
# Environment: LOCK_VENV (default .venv-lock, shared with tools/lock.sh),
# MMSOFT_INSTALL_LOGS (step logs, default install-logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/install_common.sh
source tools/install_common.sh
# shellcheck source=tools/_bundle.sh
source tools/_bundle.sh
TAG=gpu-bundle
LOCK_VENV="${LOCK_VENV:-.venv-lock}"
REQUIREMENTS=requirements/gpu-bundle.txt
REPO_LOCK=requirements/locks/gpu-bundle.txt
DEFAULT_PYTHON_VERSION=3.12
DEFAULT_PLATFORM=manylinux_2_28_x86_64
MAX_BYTES=60000000

OUT=work_dirs/gpu_bundle
PYTHON_VERSION=$DEFAULT_PYTHON_VERSION
PLATFORM=$DEFAULT_PLATFORM
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYTHON_VERSION="${2:?--python-version needs a value}"; shift 2 ;;
        --python-version=*) PYTHON_VERSION="${1#*=}"; shift ;;
        --platform) PLATFORM="${2:?--platform needs a value}"; shift 2 ;;
        --platform=*) PLATFORM="${1#*=}"; shift ;;
        -h|--help) usage 0 ;;
        -*) echo "[$TAG] unknown option: $1 (see --help)" >&2; exit 2 ;;
        *) positional+=("$1"); shift ;;
    esac
done
parse_mode ${positional[@]+"${positional[@]}"}

parse_platform

ensure_uv "$TAG"
if [ "$MODE" = lock ]; then
    if [ "$PYTHON_VERSION" != "$DEFAULT_PYTHON_VERSION" ] || [ "$PLATFORM" != "$DEFAULT_PLATFORM" ]; then
        echo "[$TAG] $REPO_LOCK is for CPython $DEFAULT_PYTHON_VERSION, $DEFAULT_PLATFORM;" \
             "other targets are locked into their bundle folder" >&2
        exit 2
    fi
    write_lock "$REPO_LOCK" "$REQUIREMENTS" 'make gpu-bundle-lock'
    exit 0
fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
check_registry "$TAG" "$LOCK_VENV/bin/python"
rm -f "$OUT"/*.whl "$OUT/gpu-bundle-lock.txt" "$OUT/SHA256SUMS"
if [ "$PYTHON_VERSION" = "$DEFAULT_PYTHON_VERSION" ] && [ "$PLATFORM" = "$DEFAULT_PLATFORM" ]; then
    [ -f "$REPO_LOCK" ] || write_lock "$REPO_LOCK" "$REQUIREMENTS" 'make gpu-bundle-lock'
    cp "$REPO_LOCK" "$OUT/gpu-bundle-lock.txt"
else
    echo "[$TAG] target CPython $PYTHON_VERSION, $PLATFORM: its lock is written into $OUT only"
    write_lock "$OUT/gpu-bundle-lock.txt" "$REQUIREMENTS" 'make gpu-bundle-lock'
fi

download_locked "$OUT/gpu-bundle-lock.txt" "$OUT"

# mmsoft's wheel, built from a copy of what the wheel is made of.
SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
sources=()
for path in pyproject.toml setup.py setup.cfg MANIFEST.in README.md LICENSE \
        model-index.yml mmsoft configs tools; do
    [ -e "$path" ] && sources+=("$path")
done
tar --exclude=__pycache__ --exclude='*.pyc' --exclude=mmsoft/.mim -cf - "${sources[@]}" \
    | tar -xf - -C "$SRC"
run_step "$TAG" "building mmsoft's wheel" mmsoft \
    "$UV" build --wheel --quiet --python "$LOCK_VENV/bin/python" \
    --build-constraints requirements/build-constraints.txt --out-dir "$OUT" "$SRC"

shopt -s nullglob
wheels=("$OUT"/*.whl)
shopt -u nullglob
seal_bundle "$OUT" "$MAX_BYTES" "remove what requirements/gpu-bundle.txt does not need" \
    "${wheels[@]##*/}" gpu-bundle-lock.txt
echo "[$TAG] copy $OUT beside the checkout on the node, then run there:"
echo "    bash tools/gpu_check_offline.sh $(basename "$OUT") work_dirs/gpu_check"
