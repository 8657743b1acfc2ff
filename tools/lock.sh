#!/usr/bin/env bash
# Regenerates requirements/locks/ from the human-edited requirement files
# (`make lock`). Every package of both environments, transitive ones
# included, is pinned there with the hashes of its files; the installers
# (tools/install_env.sh, tools/install_floor_env.sh) install from the locks
# only.
#
#   requirements/locks/stack.txt        .venv: requirements/{pip,build,runtime,tests,
#                                       deploy,mim,mmcv}.txt, mmcv itself left out
#   requirements/locks/mmcv.txt         the mmcv sdist that tools/build_mmcv_wheel.sh
#                                       compiles (its hash)
#   requirements/locks/floor.txt        .venv-floor: requirements/{pip,floor}.txt
#   requirements/locks/floor-nodeps.txt mmdet and mmsegmentation for .venv-floor,
#                                       without their dependencies
#   requirements/locks/newest.txt       .venv-newest: requirements/{pip,newest}.txt,
#                                       for CPython 3.12
#
# The locks are written with uv (requirements/lock-tool.txt), installed into
# .venv-lock/: it resolves from the index's metadata, takes the hashes the
# index publishes (no multi-GB torch download to hash), builds the one sdist
# it needs metadata from (mmcv) with the pinned build tools of
# requirements/build-constraints.txt, and writes plain requirement files that
# pip installs with --require-hashes. The locks are for x86-64 Linux, the
# machines CI and `make` run on, and CPython 3.11 (3.12 for newest.txt);
# each pins a version that has wheels for other CPythons too, with the
# hashes of all its files. setup.cfg's ranges are what a user's own
# environment is held to.
#
# Usage: bash tools/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/install_common.sh
source tools/install_common.sh
LOCK_VENV="${LOCK_VENV:-.venv-lock}"
TAG=lock

ensure_uv "$TAG"

# compile OUTPUT INPUT... [-- UV_OPTIONS...]: for CPython $LOCK_PYTHON (3.11).
compile() {
    local out="$1"; shift
    local inputs=() options=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do inputs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    options=("$@")
    run_step "$TAG" "writing $out" "${inputs[*]}" \
        "$UV" pip compile --quiet --python-version "${LOCK_PYTHON:-3.11}" \
        --python-platform x86_64-manylinux_2_28 --generate-hashes \
        --only-binary :all: --no-binary mmcv \
        --build-constraints requirements/build-constraints.txt \
        --constraint requirements/build-constraints.txt \
        --custom-compile-command 'make lock' \
        "${options[@]}" -o "$out" "${inputs[@]}"
}

mkdir -p requirements/locks
compile requirements/locks/stack.txt requirements/pip.txt requirements/build.txt \
    requirements/runtime.txt requirements/tests.txt requirements/deploy.txt \
    requirements/mim.txt requirements/mmcv.txt -- --no-emit-package mmcv
compile requirements/locks/mmcv.txt requirements/mmcv.txt -- --no-deps
compile requirements/locks/floor.txt requirements/pip.txt requirements/floor.txt
compile requirements/locks/floor-nodeps.txt requirements/floor-nodeps.txt -- --no-deps
LOCK_PYTHON=3.12 compile requirements/locks/newest.txt requirements/pip.txt requirements/newest.txt
echo "[$TAG] requirements/locks/ written; install with 'make install install-floor install-newest'"
