#!/usr/bin/env bash
# Regenerates requirements/locks/ from the human-edited requirement files
# (`make lock`). Every package of the environments, transitive ones
# included, is pinned there with the hashes of its files; the installers
# (tools/install_*env.sh) install from the locks only.
#
#   stack.txt        .venv: requirements/{pip,build,runtime,tests,deploy,mim,
#                    mmcv}.txt, mmcv itself left out
#   mmcv.txt         the mmcv sdist that tools/build_mmcv_wheel.sh compiles
#   floor.txt        .venv-floor: requirements/{pip,floor}.txt
#   floor-nodeps.txt mmdet and mmsegmentation for .venv-floor, without their
#                    dependencies
#   newest.txt       .venv-newest: requirements/{pip,newest}.txt, CPython 3.12
#
# uv (requirements/lock-tool.txt, in .venv-lock/) writes them: it resolves
# from the index's metadata with the hashes the index publishes (no torch
# download), builds mmcv's sdist for its metadata with the pinned tools of
# requirements/build-constraints.txt, and writes files for pip's
# --require-hashes. The locks are for x86-64 Linux and CPython 3.11 (3.12 for
# newest.txt), with the hashes of all the files of each version (other
# CPythons' wheels too); setup.cfg's ranges hold a user's own environment.
#
# Usage: bash tools/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/install_common.sh
source tools/install_common.sh
LOCK_VENV="${LOCK_VENV:-.venv-lock}"
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
compile requirements/locks/mmcv.txt requirements/mmcv.txt --no-deps
compile requirements/locks/floor.txt requirements/pip.txt requirements/floor.txt
compile requirements/locks/floor-nodeps.txt requirements/floor-nodeps.txt --no-deps
LOCK_PYTHON=3.12 compile requirements/locks/newest.txt requirements/pip.txt requirements/newest.txt
echo "[$TAG] requirements/locks/ written; install with 'make install install-floor install-newest'"
