#!/usr/bin/env bash
# Writes the offline OpenMMLab bundle for a GPU node (`make
# gpu-train-bundle`): what mmdet's training and COCO evaluation need beyond
# the node's own Python, torch 2.11 (CUDA 13.0), NumPy, Pillow, OpenCV, SciPy
# and Matplotlib (requirements/gpu-train-node.txt), with mmcv 2.1.0 compiled
# with its CUDA ops against that torch. tools/gpu_train_offline.sh installs
# and runs it on the node.
#
#   bash tools/gpu_train_bundle.sh lock
#       rewrites requirements/locks/gpu-train.txt (the bundle's downloaded
#       wheels) and requirements/locks/gpu-train-build.txt (the build
#       environment of mmcv's CUDA wheel); uv, hashes as the index publishes
#       them, wheels only, CPython 3.12 on manylinux_2_28 x86-64.
#   bash tools/gpu_train_bundle.sh [OUT_DIR]
#       OUT_DIR (default work_dirs/gpu_train_bundle) receives, in place of
#       the wheels it held:
#       - the wheels of requirements/locks/gpu-train.txt (mmengine, mmdet,
#         mmsegmentation, pycocotools and their small dependencies),
#         hash-checked;
#       - mmcv 2.1.0's wheel with its CUDA ops, debug symbols stripped,
#         checked to carry machine code for each GPU architecture asked for;
#       - gpu-train-lock.txt, gpu-train-node.txt, gpu-train-manifest.json
#         (each wheel's origin and size; the torch, CUDA, nvcc and GPU
#         architectures mmcv was built for, and the machine code its
#         compiled ops carry) and SHA256SUMS.
#       The folder's size is printed and must stay under 50 MB (a call to a
#       GPU node carries 64 MiB, the checkout included).
#
# mmcv's CUDA wheel is compiled once (tools/build_mmcv_wheel.sh build, from
# the sdist locked in requirements/locks/mmcv.txt) and kept under
# $MMSOFT_WHEEL_CACHE (default ~/.cache/mmsoft/wheels) in the folder that
# `tools/build_mmcv_wheel.sh key` names; later bundles take it from there.
# The compile runs on a machine without a GPU: FORCE_CUDA=1, nvcc and CUDA's
# headers from the package index (requirements/locks/gpu-train-build.txt,
# installed into $MMSOFT_GPU_BUILD_DIR/venv-build, a CPython 3.12 environment),
# and TORCH_CUDA_ARCH_LIST (default "8.0;9.0": machine code for the A100 and
# the H100/H200, no PTX).
#
# Environment: MMSOFT_GPU_BUILD_DIR (the build environment, default
# ${TMPDIR:-/tmp}/mmsoft-gpu-build, about 7 GB), MMSOFT_WHEEL_CACHE,
# TORCH_CUDA_ARCH_LIST, MAX_JOBS (compile jobs, default the number of
# cores), MMSOFT_PYTHON312 (the CPython 3.12 to build with; default
# python3.12 on PATH or in pyenv's versions), LOCK_VENV (default .venv-lock),
# MMSOFT_INSTALL_LOGS (step logs, default install-logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/install_common.sh
source tools/install_common.sh
# shellcheck source=tools/_bundle.sh
source tools/_bundle.sh
TAG=gpu-train-bundle
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
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage 0 ;;
        -*) echo "[$TAG] unknown option: $arg (see --help)" >&2; exit 2 ;;
    esac
done
parse_mode "$@"
[[ "$ARCH_LIST" =~ ^[0-9]+\.[0-9]+(\+PTX)?([\;\ ][0-9]+\.[0-9]+(\+PTX)?)*$ ]] || {
    echo "[$TAG] TORCH_CUDA_ARCH_LIST=$ARCH_LIST: expected compute capabilities" \
         "separated by ';', e.g. \"8.0;9.0\"" >&2; exit 2; }
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
    sys.exit(f'[gpu-train-bundle] {ops} of {mmcv_wheel} carries machine code for '
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
print(f'[gpu-train-bundle] {mmcv_wheel}: CUDA {torch.version.cuda} (nvcc {nvcc_version}), '
      f'machine code {", ".join(f"{a} ({n} images)" for a, n in sorted(architectures.items()))}')
PY
seal_bundle "$OUT" "$MAX_BYTES" \
    "leave out what requirements/gpu-train.txt does not need, or build for fewer architectures" \
    "${wheels[@]##*/}" gpu-train-lock.txt gpu-train-node.txt gpu-train-manifest.json
echo "[$TAG] copy $OUT beside the checkout on the node, then run there:"
echo "    bash tools/gpu_train_offline.sh $(basename "$OUT") work_dirs/gpu_train_out"
