#!/usr/bin/env bash
# Regenerates requirements/locks/ from requirements/*.txt with uv (`make
# lock`), for x86-64 Linux and CPython 3.11 (3.12 for newest.txt), every file's
# hash pinned: docs/get_started.md, "Lock files".
#
# Usage: bash tools/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/install_common.sh
source tools/install_common.sh
TAG=lock

ensure_uv "$TAG"

# compile OUTPUT ARGUMENTS...: `uv pip compile` of the requirement files and
# options ARGUMENTS, for CPython $LOCK_PYTHON (default 3.11).
compile() {
    local out="$1"; shift
    run_step "$TAG" "writing $out" "$*" \
        "$UV" pip compile --quiet --python-version "${LOCK_PYTHON:-3.11}" \
        --python-platform x86_64-manylinux_2_28 --generate-hashes \
        --only-binary :all: --no-binary mmcv \
        --build-constraints requirements/build-constraints.txt \
        --constraint requirements/build-constraints.txt \
        --custom-compile-command 'make lock' -o "$out" "$@"
}

mkdir -p requirements/locks
compile requirements/locks/stack.txt requirements/pip.txt requirements/build.txt \
    requirements/runtime.txt requirements/tests.txt requirements/deploy.txt \
    requirements/mim.txt requirements/mmcv.txt --no-emit-package mmcv
# the sdist that tools/build_mmcv_wheel.sh compiles
compile requirements/locks/mmcv.txt requirements/mmcv.txt --no-deps
compile requirements/locks/floor.txt requirements/pip.txt requirements/floor.txt
compile requirements/locks/floor-nodeps.txt requirements/floor-nodeps.txt --no-deps
LOCK_PYTHON=3.12 compile requirements/locks/newest.txt requirements/pip.txt requirements/newest.txt
echo "[$TAG] requirements/locks/ written; install with 'make install install-floor install-newest'"
