#!/usr/bin/env bash
# The GPU node without internet: a bundle of wheels packed here, run there
# with the node's own Python and torch (docs/gpu.md).
#
#   bash tools/gpu_node.sh pack check [OUT_DIR] [--python-version V] [--platform P]
#       (`make gpu-bundle`) OUT_DIR (default work_dirs/gpu_bundle) receives the
#       wheels the benchmark and the CUDA tests need beyond the node's torch,
#       NumPy and timm (requirements/gpu-bundle.txt, hash-checked from
#       requirements/locks/gpu-bundle.txt), mmsoft's own wheel, the lock and
#       SHA256SUMS; at most 60 MB. Default target: CPython 3.12,
#       manylinux_2_28_x86_64 (uv's x86_64-manylinux_2_28 too); for another
#       target the lock is resolved into OUT_DIR only.
#   bash tools/gpu_node.sh pack train [OUT_DIR]
#       (`make gpu-train-bundle`) OUT_DIR (default work_dirs/gpu_train_bundle)
#       receives what mmdet's training and COCO evaluation need beyond the
#       node's Python, torch 2.11 (CUDA 13.0), NumPy, Pillow, OpenCV, SciPy and
#       Matplotlib (requirements/gpu-train-node.txt): the wheels of
#       requirements/locks/gpu-train.txt, mmcv 2.1.0 compiled with its CUDA ops
#       against that torch (debug symbols stripped, checked to carry machine
#       code for each architecture asked for), gpu-train-lock.txt,
#       gpu-train-node.txt, gpu-train-manifest.json (each wheel's origin and
#       size; the torch, CUDA, nvcc and architectures of mmcv's build) and
#       SHA256SUMS; at most 50 MB.
#   bash tools/gpu_node.sh lock check|train
#       (`make gpu-bundle-lock`, `make gpu-train-bundle-lock`) rewrites the
#       locks of a bundle: requirements/locks/gpu-bundle.txt, or
#       requirements/locks/gpu-train.txt and gpu-train-build.txt (uv, hashes
#       as the index publishes them, wheels only, CPython 3.12).
#   bash tools/gpu_node.sh run check BUNDLE OUT_DIR [--budget-s N] [--allow-cpu]
#       [benchmark options]
#       the CUDA tests, then tools/analysis/benchmark.py at batch 2 (800x1199
#       and 800x1067 on 800x1216), float32 and AMP, AdamW steps, eager then
#       compiled: SOFT++-tiny, SOFT++-small, UFO-ViT-small and timm's Swin-T
#       and PVTv2-b2, with kernels per step, GPU-busy share and host syncs,
#       under a hard total budget (default 560 s, install included). Further
#       options go to the benchmark after these (a repeated option replaces
#       them). Writes OUT_DIR/results.json, results.md and run.log.
#   bash tools/gpu_node.sh run train BUNDLE OUT_DIR [--budget-s N]
#       [--speed-iters N] [--allow-cpu]
#       checks the training bundle and the node against its manifest, installs
#       it, checks mmcv's compiled ops (tools/analysis/check_mmcv_ops.py),
#       trains and evaluates the demo's Mask R-CNN with tools/train.py --amp
#       and tools/test.py (bbox mAP against MIN_BBOX_MAP, default 0.25), then
#       times SOFT++-tiny's, UFO-ViT-tiny's and mmdet's Swin-T Mask R-CNN
#       configs (--speed-iters, default 60, batch 2 at 800x800), and writes
#       OUT_DIR/gpu_train.md and gpu_train.json (tools/analysis/gpu_train_table.py),
#       within a hard total budget (default 540 s).
#
# On the node: first the python ($PYTHON, default python3) must import torch
# and see a CUDA device, else exit status 3 says which is missing; then the
# bundle is checked (exit status 2: missing, without wheels, holding the
# node's own torch, NumPy, timm, triton or CUDA libraries, or not matching its
# SHA256SUMS) and installed into a temporary folder (pip --target --no-index
# --no-deps), the checkout first on PYTHONPATH. --allow-cpu (or
# MMSOFT_GPU_CHECK_DEVICE=cpu) runs a CPU smoke mode of the same steps.
# MMSOFT_COMMIT names the commit in the tables where the copy has no git.
#
# Environment of pack: LOCK_VENV (default .venv-lock), MMSOFT_INSTALL_LOGS,
# MMSOFT_GPU_BUILD_DIR (mmcv's CUDA build environment, default
# ${TMPDIR:-/tmp}/mmsoft-gpu-build, about 7 GB), MMSOFT_WHEEL_CACHE (where
# mmcv's CUDA wheel is kept under `tools/build_mmcv_wheel.sh key`'s name, and
# found by later packs), TORCH_CUDA_ARCH_LIST (default "8.0;9.0"), MAX_JOBS,
# MMSOFT_PYTHON312.
#
# Exit status: 0; 1 a test, measurement or step failed (or the demo's mAP is
# below its floor); 2 invalid arguments or an unusable bundle; 3 torch, the
# GPU or a package of the node is missing (or the node's torch is not the
# bundle's); 124 the total budget ran out (what was measured is kept).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TAG=gpu-node


say() { echo "[$TAG] $*"; }
fail() { local code="$1"; shift; echo "[$TAG] $*" >&2; exit "$code"; }
# usage STATUS: this file's header comment (its lines 2 up to `set -uo`),
# on standard output for --help (STATUS 0), else on standard error.
usage() {
    local text
    text=$(sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//')
    if [ "${1:-2}" = 0 ]; then echo "$text"; else echo "$text" >&2; fi
    exit "${1:-2}"
}
elapsed() { echo $((SECONDS - START)); }
remaining() { echo $((BUDGET_S - (SECONDS - START))); }
# phase NAME SINCE: records and prints how long a phase took.
phase() {
    local seconds=$((SECONDS - $2))
    PHASES+=("$1=$seconds")
    say "$1: ${seconds} s (total $(elapsed) s of $BUDGET_S s)"
}
# phases_line: "name N s, name N s, ..." of the recorded phases.
phases_line() {
    local item line=""
    for item in ${PHASES[@]+"${PHASES[@]}"}; do
        line+="${line:+, }${item%%=*} ${item#*=} s"
    done
    echo "$line"
}

# require_device: checks that $PYTHON imports torch and sees a CUDA device;
# otherwise stops, exit status 3, saying which: no torch, torch without CUDA,
# or no GPU visible. With DEVICE=cpu (--allow-cpu) a torch without a device
# is accepted. Sets DEVICE_FOUND (1 when a GPU is visible).
require_device() {
    command -v "$PYTHON" >/dev/null 2>&1 \
        || fail 3 "no torch: PYTHON=$PYTHON cannot be run (not found). Point PYTHON at the node's python that has torch."
    local probe status
    probe=$(timeout 120 "$PYTHON" - 2>/dev/null <<'PY'
import os
import sys
where = f'{sys.executable} (Python {sys.version.split()[0]})'
try:
    import torch
except Exception as error:  # any import failure means: no usable torch
    print(f'no torch: {where} cannot import torch ({type(error).__name__}: {error})')
    sys.exit(10)
build = f'torch {torch.__version__} in {where}'
if torch.version.cuda is None and getattr(torch.version, 'hip', None) is None:
    print(f'torch without CUDA: {build} is a CPU-only build (torch.version.cuda is None)')
    sys.exit(11)
if not torch.cuda.is_available():
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    print(f'no GPU visible: {build}, built for CUDA {torch.version.cuda}, sees no '
          f'device (torch.cuda.is_available() is False'
          + ('' if visible is None else f', CUDA_VISIBLE_DEVICES={visible!r}') + ')')
    sys.exit(12)
print(f'{build}, CUDA {torch.version.cuda}: {torch.cuda.device_count()} device(s), '
      f'{torch.cuda.get_device_name(0)}')
PY
)
    status=$?
    DEVICE_FOUND=0
    case "$status" in
        0) DEVICE_FOUND=1; say "$probe" ;;
        11|12)
            if [ "$DEVICE" = cpu ]; then
                say "$probe; CPU smoke mode (--allow-cpu)"
            else
                fail 3 "$probe. Run on a node with a GPU and its CUDA build of torch, or pass --allow-cpu for the CPU smoke mode."
            fi ;;
        10) fail 3 "$probe. The command uses the node's own torch: activate the environment that has it, or set PYTHON=..." ;;
        124) fail 3 "no torch: importing torch in $PYTHON took over 120 s" ;;
        *) fail 3 "no torch: $PYTHON exited with status $status while importing torch" ;;
    esac
    [ "$DEVICE" = cpu ] && [ "$DEVICE_FOUND" = 1 ] && say "CPU smoke mode (--allow-cpu)"
    return 0
}

# check_bundle BUNDLE HINT: checks the bundle folder (exit status 2: missing,
# without wheels, holding a wheel of the node's own torch, NumPy, timm,
# triton or CUDA libraries, or not matching its SHA256SUMS); sets BUNDLE
# (absolute) and WHEELS. HINT says how to write one.
check_bundle() {
    local wheel
    [ -d "$1" ] || fail 2 "bundle $1: no such folder ($2)"
    BUNDLE="$(cd "$1" && pwd)"
    shopt -s nullglob
    WHEELS=("$BUNDLE"/*.whl)
    shopt -u nullglob
    [ "${#WHEELS[@]}" -gt 0 ] || fail 2 "bundle $BUNDLE holds no wheels"
    for wheel in "${WHEELS[@]}"; do
        case "$(basename "$wheel")" in
            torch-*|torchvision-*|numpy-*|timm-*|triton-*|nvidia_*)
                fail 2 "bundle $BUNDLE holds $(basename "$wheel"): the node's own is used, remove it" ;;
        esac
    done
    if [ -f "$BUNDLE/SHA256SUMS" ] && command -v sha256sum >/dev/null; then
        (cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS) \
            || fail 2 "bundle $BUNDLE does not match its SHA256SUMS (an incomplete copy?)"
    fi
}

# install_bundle OUT_DIR: installs WHEELS into a temporary folder (pip
# --target --no-index --no-deps; the node's packages are left as they are;
# without pip, the wheels are unpacked as they are) and puts the checkout
# ($ROOT), then that folder, first on PYTHONPATH. Sets TMP (removed on exit)
# and SITE; the log is OUT_DIR/install.log.
install_bundle() {
    local out="$1"
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/mmsoft-$TAG.XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    SITE="$TMP/site"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        timeout "$(remaining)" "$PYTHON" -m pip install --isolated --disable-pip-version-check \
            --no-index --no-deps --no-warn-script-location --target "$SITE" "${WHEELS[@]}" \
            >"$out/install.log" 2>&1 \
            || { tail -n 20 "$out/install.log" >&2; fail 2 "installing the bundle failed (log: $out/install.log)"; }
    else
        "$PYTHON" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$SITE" "${WHEELS[@]}" \
            >"$out/install.log" 2>&1 || fail 2 "unpacking the bundle failed (log: $out/install.log)"
    fi
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    say "installed ${#WHEELS[@]} wheels into $SITE"
}

# start_run: the node's interpreter (PYTHON, default python3, a relative path
# made absolute), and the clock of the total budget and its phases.
start_run() {
    PYTHON="${PYTHON:-python3}"
    case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; esac
    START=$SECONDS
    PHASES=()
}

# parse_platform: checks PLATFORM and PYTHON_VERSION; accepts uv's spelling
# of the platform (x86_64-manylinux_2_28) beside pip's, and sets PLATFORM
# (pip's), UV_PLATFORM (uv's) and TARGET_LINE (the line a lock names its
# target with).
parse_platform() {
    if [[ "$PLATFORM" =~ ^(x86_64|aarch64)-(manylinux.*)$ ]]; then
        PLATFORM="${BASH_REMATCH[2]}_${BASH_REMATCH[1]}"
    fi
    if [[ "$PLATFORM" =~ ^(manylinux.*)_(x86_64|aarch64)$ ]]; then
        UV_PLATFORM="${BASH_REMATCH[2]}-${BASH_REMATCH[1]}"
    else
        echo "[$TAG] --platform $PLATFORM: expected a manylinux tag such as manylinux_2_28_x86_64" >&2
        exit 2
    fi
    [[ "$PYTHON_VERSION" =~ ^3\.[0-9]+$ ]] || {
        echo "[$TAG] --python-version $PYTHON_VERSION: expected e.g. 3.12" >&2; exit 2; }
    TARGET_LINE="# target: CPython $PYTHON_VERSION, $PLATFORM"
}

# write_lock OUTPUT REQUIREMENTS COMMAND [UV_OPTION...]: resolves
# REQUIREMENTS for the target into OUTPUT with every file's hash, wheels only
# (uv pip compile), naming COMMAND as the one that rewrites it and the
# target in its third line. UV_OPTIONs go to uv (e.g. --override FILE).
write_lock() {
    local out="$1" requirements="$2" command="$3" resolved
    shift 3
    resolved="$(mktemp)"
    run_step "$TAG" "writing $out (CPython $PYTHON_VERSION, $PLATFORM)" "$requirements" \
        "$UV" pip compile --quiet --python-version "$PYTHON_VERSION" \
        --python-platform "$UV_PLATFORM" --generate-hashes --only-binary :all: \
        --custom-compile-command "$command" -o "$resolved" "$@" "$requirements"
    mkdir -p "$(dirname "$out")"
    { head -n 2 "$resolved"; echo "$TARGET_LINE"; tail -n +3 "$resolved"; } > "$out"
    rm -f "$resolved"
}

# download_locked LOCK OUT_DIR: the wheels LOCK pins, for the target,
# hash-checked, into OUT_DIR.
download_locked() {
    local lock="$1" out="$2"
    run_step "$TAG" "downloading the wheels of $(basename "$lock") into $out (hash-checked)" "$lock" \
        "$LOCK_VENV/bin/python" -m pip download --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: \
        --python-version "$PYTHON_VERSION" --platform "$PLATFORM" --implementation cp \
        -r "$lock" -d "$out"
}

# seal_bundle OUT_DIR MAX_BYTES HINT FILE...: writes OUT_DIR/SHA256SUMS of
# the FILEs (names inside OUT_DIR), lists them with their sizes and the
# folder's total; fails, printing HINT, when the folder holds more than
# MAX_BYTES.
seal_bundle() {
    local out="$1" max_bytes="$2" hint="$3" bytes limit
    shift 3
    (cd "$out" && sha256sum -- "$@" > SHA256SUMS)
    echo "[$TAG] $out:"
    (cd "$out" && ls -l -- "$@" SHA256SUMS | awk '{printf "    %10d  %s\n", $5, $9}')
    bytes=$(du -sb "$out" | cut -f1)
    limit=$(awk -v b="$max_bytes" 'BEGIN { printf "%.0f MB", b / 1e6 }')
    echo "[$TAG] size: $(awk -v b="$bytes" 'BEGIN { printf "%.1f MB (%d bytes)", b / 1e6, b }'), limit $limit"
    if [ "$bytes" -gt "$max_bytes" ]; then
        echo "[$TAG] the bundle is over $limit: $hint" >&2
        exit 1
    fi
}

# pack_check [OUT_DIR] [--python-version V] [--platform P] | lock
pack_check() {
    set -e
    cd "$ROOT"
    source tools/install_common.sh
    LOCK_VENV="${LOCK_VENV:-.venv-lock}"
    local requirements=requirements/gpu-bundle.txt repo_lock=requirements/locks/gpu-bundle.txt
    local default_python=3.12 default_platform=manylinux_2_28_x86_64 mode=bundle
    OUT=work_dirs/gpu_bundle PYTHON_VERSION=3.12 PLATFORM=manylinux_2_28_x86_64
    [ "${1:-}" = lock ] && { mode=lock; shift; }
    while [ $# -gt 0 ]; do
        case "$1" in
            --python-version) PYTHON_VERSION="${2:?--python-version needs a value}"; shift 2 ;;
            --python-version=*) PYTHON_VERSION="${1#*=}"; shift ;;
            --platform) PLATFORM="${2:?--platform needs a value}"; shift 2 ;;
            --platform=*) PLATFORM="${1#*=}"; shift ;;
            -*) fail 2 "unknown option: $1 (see --help)" ;;
            *) [ "$mode" = bundle ] && [ "$OUT" = work_dirs/gpu_bundle ] \
                   || fail 2 "one OUT_DIR at most, none with lock: $1 (see --help)"
               OUT="$1"; shift ;;
        esac
    done
    parse_platform
    ensure_uv "$TAG"
    local default=0
    [ "$PYTHON_VERSION" = "$default_python" ] && [ "$PLATFORM" = "$default_platform" ] && default=1
    if [ "$mode" = lock ]; then
        [ "$default" = 1 ] || fail 2 "$repo_lock is for CPython $default_python, $default_platform; other targets are locked into their bundle folder"
        write_lock "$repo_lock" "$requirements" 'make gpu-bundle-lock'
        exit 0
    fi
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    check_registry "$TAG" "$LOCK_VENV/bin/python"
    rm -f "$OUT"/*.whl "$OUT/gpu-bundle-lock.txt" "$OUT/SHA256SUMS"
    if [ "$default" = 1 ]; then
        [ -f "$repo_lock" ] || write_lock "$repo_lock" "$requirements" 'make gpu-bundle-lock'
        cp "$repo_lock" "$OUT/gpu-bundle-lock.txt"
    else
        say "target CPython $PYTHON_VERSION, $PLATFORM: its lock is written into $OUT only"
        write_lock "$OUT/gpu-bundle-lock.txt" "$requirements" 'make gpu-bundle-lock'
    fi
    download_locked "$OUT/gpu-bundle-lock.txt" "$OUT"
    # mmsoft's wheel (uv build, the pinned build tools), from a copy of what
    # the wheel is made of (setup.py copies configs/ and tools/ into mmsoft/.mim).
    SRC="$(mktemp -d)"
    trap 'rm -rf "$SRC"' EXIT
    local sources=() path wheels
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
    seal_bundle "$OUT" 60000000 "remove what requirements/gpu-bundle.txt does not need" \
        "${wheels[@]##*/}" gpu-bundle-lock.txt
    say "copy $OUT beside the checkout on the node, then run there:"
    echo "    bash tools/gpu_node.sh run check $(basename "$OUT") work_dirs/gpu_check"
}

# pack_train [OUT_DIR] | lock
pack_train() {
set -e
cd "$ROOT"
source tools/install_common.sh
LOCK_VENV="${LOCK_VENV:-.venv-lock}"
REQUIREMENTS=requirements/gpu-train.txt
NODE_REQUIREMENTS=requirements/gpu-train-node.txt
BUILD_REQUIREMENTS=requirements/gpu-train-build.txt
LOCK=requirements/locks/gpu-train.txt
BUILD_LOCK=requirements/locks/gpu-train-build.txt
LOCK_COMMAND='make gpu-train-bundle-lock'
PYTHON_VERSION=3.12
PLATFORM=manylinux_2_28_x86_64
MAX_BYTES=50000000
BUILD_DIR="${MMSOFT_GPU_BUILD_DIR:-${TMPDIR:-/tmp}/mmsoft-gpu-build}"
WHEEL_CACHE="${MMSOFT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft/wheels}"
ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"

OUT=work_dirs/gpu_train_bundle
MODE=bundle
[ "${1:-}" = lock ] && { MODE=lock; shift; }
for arg in "$@"; do
    case "$arg" in
        -*) fail 2 "unknown option: $arg (see --help)" ;;
    esac
done
[ $# -eq 0 ] || [ "$MODE" = bundle ] || fail 2 "lock takes no arguments: $* (see --help)"
[ $# -le 1 ] || fail 2 "one OUT_DIR at most: $* (see --help)"
[ $# -eq 0 ] || OUT="$1"
[[ "$ARCH_LIST" =~ ^[0-9]+\.[0-9]+(\+PTX)?([\;\ ][0-9]+\.[0-9]+(\+PTX)?)*$ ]] \
    || fail 2 "TORCH_CUDA_ARCH_LIST=$ARCH_LIST: expected compute capabilities separated by ';', e.g. \"8.0;9.0\""
parse_platform

# lock_bundle OUTPUT: requirements/gpu-train.txt resolved without the node's
# packages (and mmcv, which is built): each overridden with a marker that
# never holds, which drops it from the resolution.
lock_bundle() {
    local overrides
    overrides="$(mktemp)"
    sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\).*/\1; sys_platform == "never"/p' \
        "$NODE_REQUIREMENTS" > "$overrides"
    echo 'mmcv; sys_platform == "never"' >> "$overrides"
    write_lock "$1" "$REQUIREMENTS" "$LOCK_COMMAND" --override "$overrides"
    rm -f "$overrides"
}

ensure_uv "$TAG"
if [ "$MODE" = lock ]; then
    lock_bundle "$LOCK"
    write_lock "$BUILD_LOCK" "$BUILD_REQUIREMENTS" "$LOCK_COMMAND"
    exit 0
fi

# build_python: the CPython 3.12 that the build environment is made with.
build_python() {
    local candidate
    for candidate in ${MMSOFT_PYTHON312:+"$MMSOFT_PYTHON312"} python3.12 \
            "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python3.12; do
        if command -v "$candidate" >/dev/null 2>&1 \
                && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$candidate"; return 0
        fi
    done
    echo "[$TAG] no CPython 3.12 found (MMSOFT_PYTHON312, python3.12 on PATH, pyenv's" \
         "versions): mmcv's wheel is built for the node's Python, 3.12" >&2
    return 1
}

# ensure_build_env: $BUILD_DIR/venv-build with the locked torch and CUDA
# compiler, and $BUILD_DIR/cuda-home, the CUDA home that mmcv's build is
# pointed at: the index's CUDA 13 packages keep nvcc, headers and libraries
# in site-packages/nvidia/cu13, whose lib/ has libcudart.so.13 but not the
# libcudart.so that the extension links with (-lcudart).
ensure_build_env() {
    BUILD_VENV="$BUILD_DIR/venv-build"
    BUILD_PY="$BUILD_VENV/bin/python"
    if [ ! -x "$BUILD_PY" ]; then
        local base
        base=$(build_python) || exit 1
        check_disk "$TAG" 7 1 "$BUILD_VENV"
        mkdir -p "$BUILD_DIR"
        run_step "$TAG" "creating the build environment $BUILD_VENV ($base)" python \
            "$base" -m venv "$BUILD_VENV"
    fi
    PIP_CONSTRAINT=/dev/null install_locked "$TAG" "$BUILD_VENV" "$BUILD_LOCK"
    local cu13
    cu13=$("$BUILD_PY" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
    [ -x "$cu13/bin/nvcc" ] || { echo "[$TAG] no nvcc in $cu13/bin ($BUILD_LOCK)" >&2; exit 1; }
    CUDA_HOME="$BUILD_DIR/cuda-home"
    mkdir -p "$CUDA_HOME/lib64"
    local name lib
    for name in bin include nvvm; do ln -sfn "$cu13/$name" "$CUDA_HOME/$name"; done
    for lib in "$cu13"/lib/*.so*; do ln -sfn "$lib" "$CUDA_HOME/lib64/"; done
    ln -sfn "$cu13/lib/libcudart.so.13" "$CUDA_HOME/lib64/libcudart.so"
}

# strip_wheel WHEEL OUT_DIR: WHEEL repacked into OUT_DIR with the debug
# symbols of its compiled ops removed (Python's own compile flags carry -g).
strip_wheel() {
    local wheel="$1" out="$2" tmp
    tmp=$(mktemp -d)
    "$BUILD_PY" -m wheel unpack -d "$tmp" "$wheel" >/dev/null
    strip --strip-debug "$tmp"/*/mmcv/_ext*.so
    "$BUILD_PY" -m wheel pack -d "$out" "$tmp"/* >/dev/null
    rm -rf "$tmp"
}

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
check_registry "$TAG" "$LOCK_VENV/bin/python"
rm -f "$OUT"/*.whl "$OUT"/gpu-train-*.txt "$OUT/gpu-train-manifest.json" "$OUT/SHA256SUMS"
[ -f "$LOCK" ] || lock_bundle "$LOCK"
[ -f "$BUILD_LOCK" ] || write_lock "$BUILD_LOCK" "$BUILD_REQUIREMENTS" "$LOCK_COMMAND"
cp "$LOCK" "$OUT/gpu-train-lock.txt"
cp "$NODE_REQUIREMENTS" "$OUT/gpu-train-node.txt"
download_locked "$OUT/gpu-train-lock.txt" "$OUT"

# mmcv with its CUDA ops, from the cache or compiled into it.
ensure_build_env
export CUDA_HOME FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCH_LIST"
KEY=$(bash tools/build_mmcv_wheel.sh key "$BUILD_PY")
MMCV_WHEELS="$WHEEL_CACHE/$KEY"
if ls "$MMCV_WHEELS"/mmcv-*.whl >/dev/null 2>&1; then
    echo "[$TAG] mmcv's CUDA wheel found in $MMCV_WHEELS"
else
    echo "[$TAG] compiling mmcv with its CUDA ops for TORCH_CUDA_ARCH_LIST=$ARCH_LIST" \
         "(kept in $MMCV_WHEELS afterwards; hours on 2 cores with MAX_JOBS=1)"
    bash tools/build_mmcv_wheel.sh build "$BUILD_PY" "$MMCV_WHEELS"
fi
BUILT=$(ls "$MMCV_WHEELS"/mmcv-*.whl)
strip_wheel "$BUILT" "$OUT"

# The manifest: what each wheel is and where it came from, and the GPU
# architectures whose machine code the compiled ops carry (read from the
# ELF images in their .nv_fatbin section); each of TORCH_CUDA_ARCH_LIST must
# be there.
shopt -s nullglob
wheels=("$OUT"/*.whl)
shopt -u nullglob
"$BUILD_PY" - "$OUT" "$PYTHON_VERSION" "$PLATFORM" "$KEY" "$ARCH_LIST" "$CUDA_HOME/bin/nvcc" \
    "$BUILT" "${wheels[@]##*/}" <<'PY' || exit 1
import json
import os
import re
import struct
import subprocess
import sys
import zipfile

import torch

out, python_version, platform, key, arch_list, nvcc, built, *wheels = sys.argv[1:]


def fatbin_architectures(elf: bytes) -> dict:
    """{'sm_80': count, ...} of the ELF (SASS) and PTX images in the
    .nv_fatbin section of a shared library (ELF64, little-endian)."""
    shoff, = struct.unpack_from('<Q', elf, 0x28)
    entsize, count, names = struct.unpack_from('<HHH', elf, 0x3A)
    sections = [struct.unpack_from('<IIQQQQ', elf, shoff + i * entsize) for i in range(count)]
    table = sections[names][4]
    found = {}
    for name, _, _, _, offset, size in sections:
        if elf[table + name:elf.index(b'\0', table + name)] != b'.nv_fatbin':
            continue
        position, end = offset, offset + size
        while position < end:  # fatbins: a 16-byte header, then entries
            magic, _, header, length = struct.unpack_from('<IHHQ', elf, position)
            if magic != 0xBA55ED50:
                position += 8
                continue
            entry, stop = position + header, position + header + length
            while entry < stop:
                kind, _, entry_header, payload = struct.unpack_from('<HHIQ', elf, entry)
                arch, = struct.unpack_from('<I', elf, entry + 28)
                label = ('ptx_' if kind == 1 else 'sm_') + str(arch)
                found[label] = found.get(label, 0) + 1
                entry += entry_header + payload
            position = stop
    return found


mmcv_wheel = next(w for w in wheels if w.startswith('mmcv-'))
with zipfile.ZipFile(os.path.join(out, mmcv_wheel)) as wheel:
    ops = next(n for n in wheel.namelist() if re.match(r'mmcv/_ext.*\.so$', n))
    architectures = fatbin_architectures(wheel.read(ops))
wanted = {'sm_' + arch.split('+')[0].replace('.', '')
          for arch in re.split('[; ]', arch_list) if arch}
if not wanted <= set(architectures):
    sys.exit(f'[gpu-node] {ops} of {mmcv_wheel} carries machine code for '
             f'{sorted(architectures) or "no GPU"}, not for all of {sorted(wanted)} '
             f'(TORCH_CUDA_ARCH_LIST={arch_list})')
nvcc_version = re.search(r'release \S+, V(\S+)', subprocess.run(
    [nvcc, '--version'], capture_output=True, text=True, check=True).stdout).group(1)
node = []
with open(os.path.join(out, 'gpu-train-node.txt')) as file:
    for line in file:
        name = re.match(r'[A-Za-z0-9][A-Za-z0-9._-]*', line)
        if name:
            node.append(name.group(0))
manifest = dict(
    target=dict(python=python_version, platform=platform),
    mmcv=dict(wheel=mmcv_wheel, torch=torch.__version__, cuda=torch.version.cuda,
              nvcc=nvcc_version, arch_list=arch_list, fatbin=architectures,
              cache_key=key, compiled_bytes=os.path.getsize(built),
              debug_symbols='stripped'),
    node_packages=node,
    wheels=[dict(file=w, bytes=os.path.getsize(os.path.join(out, w)),
                 origin='built' if w == mmcv_wheel else 'gpu-train-lock.txt')
            for w in sorted(wheels)])
with open(os.path.join(out, 'gpu-train-manifest.json'), 'w') as file:
    json.dump(manifest, file, indent=2)
    file.write('\n')
print(f'[gpu-node] {mmcv_wheel}: CUDA {torch.version.cuda} (nvcc {nvcc_version}), '
      f'machine code {", ".join(f"{a} ({n} images)" for a, n in sorted(architectures.items()))}')
PY
seal_bundle "$OUT" "$MAX_BYTES" \
    "leave out what requirements/gpu-train.txt does not need, or build for fewer architectures" \
    "${wheels[@]##*/}" gpu-train-lock.txt gpu-train-node.txt gpu-train-manifest.json
say "copy $OUT beside the checkout on the node, then run there:"
echo "    bash tools/gpu_node.sh run train $(basename "$OUT") work_dirs/gpu_train_out"
}

# The benchmark of a GPU run (issue 65's, docs/gpu.md): what `run check`
# passes to tools/analysis/benchmark.py on a GPU.
GPU_RUN=(--models soft++-tiny soft++-small ufo-vit-small timm-swin-t timm-pvtv2-b2
         --images 800x1199 800x1067 --precisions float32 amp --optimizer adamw
         --compile inductor --warmup 10 --steps 15 --rounds 2 --kernels 2 --host-sync)

# run_check BUNDLE OUT_DIR [--budget-s N] [--allow-cpu] [benchmark options]
run_check() {
BUDGET_S=
DEVICE=cuda
[ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
start_run
[ $# -ge 2 ] && [[ "$1" != -* ]] && [[ "$2" != -* ]] || usage 2
BUNDLE="$1"
OUT="$2"
shift 2
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) BUDGET_S="${2:-}"; shift 2 || shift ;;
        --budget-s=*) BUDGET_S="${1#*=}"; shift ;;
        --allow-cpu) DEVICE=cpu; shift ;;
        --) shift; EXTRA+=("$@"); break ;;
        *) EXTRA+=("$1"); shift ;;
    esac
done
BUDGET_S="${BUDGET_S:-560}"
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 30 ] \
    || fail 2 "--budget-s $BUDGET_S: expected whole seconds, 30 or more"

# 1. torch and the device.
since=$SECONDS
require_device
phase device "$since"

# 2. The bundle, installed into a temporary folder.
since=$SECONDS
check_bundle "$BUNDLE" "write it with 'make gpu-bundle'"
mkdir -p "$OUT" || fail 2 "cannot create $OUT"
OUT="$(cd "$OUT" && pwd)"
install_bundle "$OUT"
phase install "$since"

# 3. The tests and the benchmark, under what is left of the budget; the
#    benchmark's own budget ends 10 s before the hard limit (`timeout`), so
#    that it writes its results before it could be killed.
since=$SECONDS
args=(--out-dir "$OUT" --tests)
if [ "$DEVICE" = cpu ]; then
    args+=(--device cpu --smoke)
else
    args+=(--device cuda "${GPU_RUN[@]}")
fi
left=$(($(remaining) - 2))
[ "$left" -ge 20 ] || fail 124 "the total budget of $BUDGET_S s is spent before the benchmark"
args+=(--budget-s "$((left - 10))")
rm -f "$OUT/results.json" "$OUT/results.md"
say "running tools/analysis/benchmark.py ${args[*]}${EXTRA[*]:+ ${EXTRA[*]}} (hard limit ${left} s)"
(cd "$ROOT" && timeout --kill-after=5 "$left" "$PYTHON" tools/analysis/benchmark.py \
    "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"}) 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
[ "$status" = 137 ] && status=124
[ "$status" = 124 ] && say "stopped by the total budget of $BUDGET_S s: what was measured is kept"
phase benchmark "$since"
{
    [ -s "$OUT/results.md" ] || printf '# Benchmark\n\nNo table was written. The end of the log:\n\n```\n%s\n```\n' "$(tail -n 40 "$OUT/run.log")"
    echo
    echo "Offline run: exit status $status; total $(elapsed) s of a $BUDGET_S s budget. Phases: $(phases_line)."
} >> "$OUT/results.md"
say "written: $OUT/results.json, $OUT/results.md, $OUT/run.log (total $(elapsed) s)"
exit "$status"
}

# run_train BUNDLE OUT_DIR [--budget-s N] [--speed-iters N] [--allow-cpu]
run_train() {
BUDGET_S=540
SPEED_ITERS=60
MIN_BBOX_MAP="${MIN_BBOX_MAP:-0.25}"
WORK_ROOT="${WORK_ROOT:-$ROOT/work_dirs/gpu_train}"
DEVICE=cuda
[ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
start_run
DEMO_CONFIG=configs/demo/mask-rcnn_soft-tiny_fpn_demo.py
# label, config (mmdet:: names a config of mmdet's wheel).
SPEED_RUNS=(
    "soft++-tiny configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py"
    "ufo-vit-tiny configs/ufo_vit/mask-rcnn_ufo-vit-tiny_fpn_1x_coco.py"
    "swin-t mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py"
)

[ $# -ge 2 ] && [[ "$1" != -* ]] && [[ "$2" != -* ]] || usage 2
BUNDLE_ARG="$1"
OUT="$2"
shift 2
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) BUDGET_S="${2:-}"; shift 2 || shift ;;
        --budget-s=*) BUDGET_S="${1#*=}"; shift ;;
        --speed-iters) SPEED_ITERS="${2:-}"; shift 2 || shift ;;
        --speed-iters=*) SPEED_ITERS="${1#*=}"; shift ;;
        --allow-cpu) DEVICE=cpu; shift ;;
        *) fail 2 "unknown argument: $1 (accepted: --budget-s N, --speed-iters N, --allow-cpu; see --help)" ;;
    esac
done
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 60 ] \
    || fail 2 "--budget-s $BUDGET_S: expected whole seconds, 60 or more"
[[ "$SPEED_ITERS" =~ ^[0-9]+$ ]] && [ "$SPEED_ITERS" -ge 2 ] && [ "$SPEED_ITERS" -le 300 ] \
    || fail 2 "--speed-iters $SPEED_ITERS: expected a whole number of iterations from 2 to 300"
[[ "$MIN_BBOX_MAP" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] \
    || fail 2 "MIN_BBOX_MAP=$MIN_BBOX_MAP: expected a number from 0 to 1"

# 1. torch and the device.
since=$SECONDS
require_device
phase device "$since"

# 2. The bundle and the node.
since=$SECONDS
check_bundle "$BUNDLE_ARG" "write it with 'make gpu-train-bundle'"
for name in gpu-train-manifest.json gpu-train-node.txt; do
    [ -f "$BUNDLE/$name" ] || fail 2 "bundle $BUNDLE has no $name: not a training bundle (write one with 'make gpu-train-bundle')"
done
ls "$BUNDLE"/mmcv-*.whl >/dev/null 2>&1 \
    || fail 2 "bundle $BUNDLE holds no mmcv wheel (write it with 'make gpu-train-bundle')"
node=$(timeout 300 "$PYTHON" - "$BUNDLE" 2>&1 <<'PY'
import importlib
import json
import os
import re
import sys

import torch

bundle = sys.argv[1]
# Distributions whose import name is not their own.
MODULES = {'pillow': 'PIL', 'opencv-python': 'cv2', 'opencv-python-headless': 'cv2'}
try:
    with open(os.path.join(bundle, 'gpu-train-manifest.json')) as file:
        built = json.load(file)['mmcv']
    built_torch, built_cuda = built['torch'], built['cuda']
except (OSError, ValueError, KeyError) as error:
    print(f'bundle: gpu-train-manifest.json is unreadable ({type(error).__name__}: {error})')
    sys.exit(2)
problems = []
release = lambda version: '.'.join(version.split('+')[0].split('.')[:2])  # noqa: E731
node_cuda = torch.version.cuda or 'none'
if (release(torch.__version__) != release(built_torch)
        or node_cuda.split('.')[0] != str(built_cuda).split('.')[0]):
    problems.append(
        f"the node's torch {torch.__version__} (CUDA {node_cuda}) is not the torch the "
        f"bundle's mmcv was compiled against, {built_torch} (CUDA {built_cuda}): make the "
        'bundle with that torch (requirements/gpu-train-build.txt)')
wanted = {}
with open(os.path.join(bundle, 'gpu-train-node.txt')) as file:
    for line in file:
        name = re.match(r'[A-Za-z0-9][A-Za-z0-9._-]*', line)
        if name:
            module = MODULES.get(name.group(0).lower(), name.group(0).replace('-', '_'))
            wanted.setdefault(module, []).append(name.group(0))
for module, names in wanted.items():
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure: the node cannot provide it
        problems.append(f"missing on the node: {' or '.join(names)} (import {module}: "
                        f'{type(error).__name__}: {error})')
if problems:
    print('; '.join(problems))
    sys.exit(3)
print(f"the node provides {', '.join(sorted(wanted))}; torch {torch.__version__} matches "
      f"the bundle's mmcv ({built_torch})")
PY
)
case $? in
    0) say "$node" ;;
    2) fail 2 "$node" ;;
    3) fail 3 "$node. The bundle takes these from the node's Python: install them there, or carry their wheels (docs/gpu.md)." ;;
    *) fail 3 "checking the node's packages with $PYTHON failed: $node" ;;
esac
mkdir -p "$OUT" "$WORK_ROOT" || fail 2 "cannot create $OUT or $WORK_ROOT"
OUT="$(cd "$OUT" && pwd)"
WORK_ROOT="$(cd "$WORK_ROOT" && pwd)"
LOG="$OUT/gpu_train.log"
: > "$LOG"
install_bundle "$OUT"
CUDA_VERSION=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["mmcv"]["cuda"])' \
    "$BUNDLE/gpu-train-manifest.json")
ops_args=(--cuda-version "$CUDA_VERSION")
[ "$DEVICE" = cuda ] && ops_args+=(--require-cuda)
(cd "$ROOT" && "$PYTHON" tools/analysis/check_mmcv_ops.py "${ops_args[@]}") 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || fail 1 "mmcv's compiled ops do not run (log: $LOG)"
phase install "$since"

# step NAME COMMAND...: runs COMMAND in the checkout under what is left
# of the budget (less RESERVE_S for what follows), its output into the log;
# sets STEP_STATUS (124 when the budget stopped it, or when none was left).
RESERVE_S=15
step() {
    local name="$1" left
    shift
    left=$(($(remaining) - RESERVE_S))
    if [ "$left" -lt 10 ]; then
        say "$name: skipped, the budget is spent"
        STEP_STATUS=skipped
        return
    fi
    say "$name: $* (at most $left s)" | tee -a "$LOG"
    (cd "$ROOT" && timeout --kill-after=5 "$left" "$@") >> "$LOG" 2>&1
    STEP_STATUS=$?
    [ "$STEP_STATUS" = 137 ] && STEP_STATUS=124
    [ "$STEP_STATUS" = 0 ] || { say "$name: exit status $STEP_STATUS (log: $LOG)"; tail -n 15 "$LOG" >&2; }
}
# failed STATUS: the command's exit status after a step that did not pass: 1
# for a failure, whatever else happened; else 124 for a step that the budget
# stopped or left out.
FAILED=0
failed() {
    case "$1" in
        124|skipped) [ "$FAILED" = 1 ] || FAILED=124 ;;
        *) FAILED=1 ;;
    esac
}

AMP=(--amp)
DEMO_TRAIN=()
DEMO_TEST=()
SPEED_LOG_INTERVAL=10
if [ "$DEVICE" = cpu ]; then
    AMP=()
    DEMO_TRAIN=(--cfg-options train_cfg.max_epochs=1 train_cfg.val_interval=100
                train_dataloader.dataset.indices=16 default_hooks.logger.interval=1)
    DEMO_TEST=(--cfg-options test_dataloader.dataset.indices=8)
    SPEED_ITERS=2
    SPEED_LOG_INTERVAL=1
fi

# 4. The demo.
since=$SECONDS
DEMO_DIR="$WORK_ROOT/demo"
rm -rf "$DEMO_DIR"
step data "$PYTHON" tools/generate_demo_data.py coco --seed 0
demo_status=$STEP_STATUS
if [ "$demo_status" = 0 ]; then
    step demo-train "$PYTHON" tools/train.py "$DEMO_CONFIG" --work-dir "$DEMO_DIR" \
        ${AMP[@]+"${AMP[@]}"} ${DEMO_TRAIN[@]+"${DEMO_TRAIN[@]}"}
    demo_status=$STEP_STATUS
fi
if [ "$demo_status" = 0 ]; then
    step demo-test "$PYTHON" tools/test.py "$DEMO_CONFIG" "$(cat "$DEMO_DIR/last_checkpoint")" \
        --work-dir "$DEMO_DIR" ${DEMO_TEST[@]+"${DEMO_TEST[@]}"}
    demo_status=$STEP_STATUS
fi
if [ "$demo_status" = 0 ] && [ "$DEVICE" = cuda ]; then
    step demo-check "$PYTHON" tools/analysis/check_metric.py "$DEMO_DIR" coco/bbox_mAP "$MIN_BBOX_MAP"
    demo_status=$STEP_STATUS
fi
[ "$demo_status" = 0 ] || failed "$demo_status"
phase demo "$since"

# 5. Speed: three configs on the demo data, the same schedule and size.
since=$SECONDS
# The demo data's classes, from its annotations, in the order of their ids.
CLASSES=$("$PYTHON" -c 'import json, sys
categories = sorted(json.load(open(sys.argv[1]))["categories"], key=lambda c: c["id"])
print(",".join(c["name"] for c in categories))' "$ROOT/data/demo_coco/annotations/instances_train.json" 2>>"$LOG")
if [ -z "$CLASSES" ]; then
    say "speed: no classes in $ROOT/data/demo_coco/annotations/instances_train.json: the speed runs are left out (log: $LOG)"
    failed 1
    SPEED_RUNS=()
fi
NUM_CLASSES=$(echo "$CLASSES" | tr ',' '\n' | wc -l)
SPEED_OPTIONS=(
    train_dataloader.batch_size=2
    train_dataloader.dataset.data_root=data/demo_coco/
    train_dataloader.dataset.ann_file=annotations/instances_train.json
    train_dataloader.dataset.data_prefix.img=train/
    "train_dataloader.dataset.metainfo.classes=($CLASSES)"
    "train_dataloader.dataset.indices=$((2 * SPEED_ITERS))"
    "model.roi_head.bbox_head.num_classes=$NUM_CLASSES"
    "model.roi_head.mask_head.num_classes=$NUM_CLASSES"
    model.backbone.init_cfg=None
    train_cfg.max_epochs=1
    val_dataloader=None val_cfg=None val_evaluator=None
    "default_hooks.logger.interval=$SPEED_LOG_INTERVAL"
    default_hooks.checkpoint.interval=1000 default_hooks.checkpoint.save_last=False
)
MMDET_CONFIGS=$(cd "$ROOT" && "$PYTHON" -c 'import mmdet, os; print(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs"))')
table_runs=()
for item in ${SPEED_RUNS[@]+"${SPEED_RUNS[@]}"}; do
    read -r label config <<<"$item"
    case "$config" in mmdet::*) config="$MMDET_CONFIGS/${config#mmdet::}" ;; esac
    rm -rf "$WORK_ROOT/speed-$label"
    step "speed-$label" "$PYTHON" tools/train.py "$config" --work-dir "$WORK_ROOT/speed-$label" \
        ${AMP[@]+"${AMP[@]}"} --cfg-options "${SPEED_OPTIONS[@]}"
    [ "$STEP_STATUS" = 0 ] || failed "$STEP_STATUS"
    table_runs+=(--run "label=$label" "work_dir=$WORK_ROOT/speed-$label" batch=2 size=800x800
                 "status=$STEP_STATUS" "config=$config")
done
phase speed "$since"

# 6. The table.
device_line=$("$PYTHON" -c 'import torch, sys
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU smoke mode)"
print(f"{name}; torch {torch.__version__}; Python {sys.version.split()[0]}")')
(cd "$ROOT" && "$PYTHON" tools/analysis/gpu_train_table.py --out "$OUT" --device "$device_line" \
    --skip 1 \
    --run label=demo "work_dir=$DEMO_DIR" batch=8 size=160x160 "metrics=$DEMO_DIR" \
        "status=$demo_status" "config=$DEMO_CONFIG" \
    ${table_runs[@]+"${table_runs[@]}"} \
    --note "Demo: $DEMO_CONFIG${AMP[*]:+ (--amp)}, bbox mAP floor $MIN_BBOX_MAP$([ "$DEVICE" = cpu ] && echo ' (not checked in the CPU smoke mode)')." \
    --note "Speed runs: --cfg-options ${SPEED_OPTIONS[*]}" \
    --note "Offline run: total $(elapsed) s of a $BUDGET_S s budget. Phases: $(phases_line).") \
    || failed 1
say "written: $OUT/gpu_train.md, $OUT/gpu_train.json, $LOG (total $(elapsed) s)"
exit "$FAILED"
}

case "${3:-}" in -h|--help) usage 0 ;; esac
case "${1:-} ${2:-}" in
    "pack check") shift 2; pack_check "$@" ;;
    "pack train") shift 2; pack_train "$@" ;;
    "lock check") shift 2; pack_check lock "$@" ;;
    "lock train") shift 2; pack_train lock "$@" ;;
    "run check") shift 2; run_check "$@" ;;
    "run train") shift 2; run_train "$@" ;;
    -h*|--help*) usage 0 ;;
    *) usage 2 ;;
esac
