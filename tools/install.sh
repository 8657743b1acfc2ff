#!/usr/bin/env bash
# The installers of `make` (docs/get_started.md); a second run only verifies:
#
#   bash tools/install.sh stack [VENV]    .venv/: the locked OpenMMLab stack
#       (requirements/locks/stack.txt), mmcv with its ops (its wheel cached)
#       and mmsoft in editable mode (`make install`)
#   bash tools/install.sh floor [VENV]    .venv-floor/: torch 2.1.2 and
#       mmcv-lite (requirements/locks/floor*.txt), for `make test-floor`
#   bash tools/install.sh newest [VENV]   .venv-newest/: CPython 3.12, the
#       newest torch, no OpenMMLab (requirements/locks/newest.txt), for
#       `make test-newest`; its interpreter: docs/testing.md
#   bash tools/install.sh lock            requirements/locks/ from
#       requirements/*.txt with uv, every file's hash pinned (`make lock`)
#   bash tools/install.sh check-disks TAG VENV:KIND...   the disk for several
#       environments at once (`make test`)
#
# Sourced (build_mmcv_wheel.sh, gpu_node.sh pack), it defines the helpers
# alone. Each step logs into $MMSOFT_INSTALL_LOGS (install-logs/).

#: The Python of the newest environment, and of its lock.
NEWEST_PYTHON=3.12

[ "${BASH_SOURCE[0]}" != "$0" ] || cd "$(dirname "$0")/.."
MMSOFT_INSTALL_LOGS="${MMSOFT_INSTALL_LOGS:-$(pwd)/install-logs}"

# run_step TAG STEP PACKAGE CMD...: CMD with its output in a log; where it
# fails, exits naming the step, the package, the log's end and what to try:
# the hint of the first pair below (grep's options and pattern; the hint)
# whose pattern the log holds.
run_step() {
    local tag="$1" step="$2" package="$3" log start=$SECONDS options pattern text
    local hint="read the log above for the first error."; shift 3
    log=$(printf '%s' "$step" | tr -c 'A-Za-z0-9._-' '-' | tr -s '-' | cut -c1-80)
    log="$MMSOFT_INSTALL_LOGS/$tag-$log.log"
    mkdir -p "$MMSOFT_INSTALL_LOGS"
    echo "[$tag] $step (log: $log)"
    if "$@" >"$log" 2>&1; then
        echo "[$tag]   done in $((SECONDS - start)) s"
        return 0
    fi
    while read -r options pattern && read -r text; do
        if grep -q"$options" "$pattern" "$log"; then
            hint=$text
            break
        fi
    done <<HINTS
iE No space left on device|Errno 28
the disk ran full. Free space where the environment lives and in \$TMPDIR (${TMPDIR:-/tmp}), or point TMPDIR at a larger disk, then run the command again.
iE NewConnectionError|Name or service not known|Temporary failure in name resolution|Connection (refused|reset)|Network is unreachable|Max retries exceeded|ConnectTimeout|Read ?timed ?out|ProxyError|SSLError|certificate verify failed|Could not fetch URL|failed to fetch|error sending request
the package registry could not be reached. Check the network, a proxy (HTTPS_PROXY) or the configured index (pip config list), then run the command again: what is already installed is kept.
E DO NOT MATCH THE HASHES|hash mismatch|Hash mismatch
a downloaded file does not match the hash in requirements/locks/. The index serves another file under that version: check which index pip uses (pip config list), or regenerate the locks with 'make lock' and review the diff.
E No matching distribution|Could not find a version|not find a version|there is no version of|no wheels with a matching
the index holds no file of a locked version for this Python and platform. The locks are made for CPython 3.11 on x86-64 Linux (python3 --version: $(python3 --version 2>&1)); elsewhere install mmsoft into your own environment (see the README's Installation).
F No module named 'pkg_resources'
a build ran with setuptools 82 or newer, which has no pkg_resources. Builds must use the pinned tools of requirements/build-constraints.txt.
E error: command .* failed|fatal error:|ninja: build stopped
the compiler failed. Check that gcc/g++ and the Python headers are installed (python3-dev), and look for the first 'error:' in the log.
HINTS
    {
        echo "[$tag] FAILED: $step"
        echo "[$tag]   package: $package"
        echo "[$tag]   log:     $log (last lines below)"
        tail -n 25 "$log" | sed 's/^/    | /'
        echo "[$tag]   what to try: $hint"
    } >&2
    exit 1
}

# existing PATH: PATH, or its nearest parent that exists.
existing() {
    local path="$1"
    while [ ! -e "$path" ]; do path=$(dirname "$path"); done
    echo "$path"
}

# free_gib PATH: free GiB (rounded down) where PATH is or would be.
free_gib() {
    df -Pk "$(existing "$1")" | awk 'NR == 2 { print int($4 / 1048576) }'
}

# check_disk TAG VENV_GIB TMP_GIB VENV: refuses to start when the file system
# of VENV has less than VENV_GIB free, or $TMPDIR less than TMP_GIB (both on
# one file system: their sum).
check_disk() {
    local tag="$1" venv_gib="$2" tmp_gib="$3" venv="$4"
    local tmp="${TMPDIR:-/tmp}" venv_free tmp_free venv_dev tmp_dev
    venv_free=$(free_gib "$venv")
    tmp_free=$(free_gib "$tmp")
    venv_dev=$(stat -c %d "$(existing "$venv")")
    tmp_dev=$(stat -c %d "$(existing "$tmp")")
    if [ "$venv_dev" = "$tmp_dev" ]; then
        venv_gib=$((venv_gib + tmp_gib)); tmp_gib=0
    fi
    if [ "$venv_free" -lt "$venv_gib" ] || [ "$tmp_free" -lt "$tmp_gib" ]; then
        {
            echo "[$tag] not enough free disk space to install $venv:"
            echo "[$tag]   needed: $venv_gib GiB for the environment, $tmp_gib GiB more in \$TMPDIR ($tmp) for downloads and builds"
            echo "[$tag]   free:   $venv_free GiB there, $tmp_free GiB in $tmp"
            echo "[$tag]   what to try: free space, or set TMPDIR to a larger disk"
        } >&2
        exit 1
    fi
}

# env_disk KIND: the GiB the environment KIND (stack, floor, newest) holds and
# its install needs in $TMPDIR (du, rounded up); `suites`: what the suites write.
env_disk() {
    case "$1" in
        stack) echo "7 1" ;;   # torch 2.14.1 (CUDA 13), the stack, mmcv's build
        floor) echo "6 1" ;;   # torch 2.1.2 (CUDA 12.1)
        newest) echo "6 1" ;;  # torch 2.15.0 (CUDA 13.2)
        suites) echo "0 3" ;;  # what the three suites write (tmp_path, work_dirs)
        *) echo "env_disk: unknown environment '$1' (stack, floor, newest, suites)" >&2; return 1 ;;
    esac
}

# has_torch VENV: whether VENV's python imports torch (its large part).
has_torch() {
    "$1/bin/python" -c 'import torch' >/dev/null 2>&1
}

# check_disks TAG VENV:KIND...: refuses to start when the disk cannot hold
# together the environments of the list not installed yet (has_torch), which
# `make test` installs while the others stay, and what `:suites` writes.
check_disks() {
    local tag="$1"; shift
    local item venv kind need gib tmp venv_gib=0 tmp_gib=0 install_tmp=0 missing=()
    for item in "$@"; do
        venv="${item%%:*}"; kind="${item#*:}"
        need=$(env_disk "$kind") || exit 1
        read -r gib tmp <<<"$need"
        if [ "$kind" = suites ]; then  # no environment: counted every time
            tmp_gib=$((tmp_gib + tmp)); continue
        fi
        has_torch "$venv" && continue
        venv_gib=$((venv_gib + gib)); [ "$tmp" -gt "$install_tmp" ] && install_tmp=$tmp
        missing+=("$venv")
    done
    tmp_gib=$((tmp_gib + install_tmp))
    if [ ${#missing[@]} -gt 0 ]; then
        echo "[$tag] to install: ${missing[*]} ($venv_gib GiB, and $tmp_gib GiB more in \$TMPDIR)"
    fi
    check_disk "$tag" "$venv_gib" "$tmp_gib" "${missing[0]:-.}"
}

# package_index PYTHON: the package index pip is configured with
# (PIP_INDEX_URL, else PYTHON's pip config), PyPI's where none is.
package_index() {
    local url="${PIP_INDEX_URL:-}"
    [ -n "$url" ] || url=$("$1" -m pip config get global.index-url 2>/dev/null) || true
    echo "${url:-https://pypi.org/simple}"
}

# check_registry TAG PYTHON: fails at once, saying so, when the package index
# (package_index) cannot be reached.
check_registry() {
    local tag="$1" py="$2"
    mkdir -p "$MMSOFT_INSTALL_LOGS"
    if ! "$py" - "$(package_index "$py")" <<'PY' 2>"$MMSOFT_INSTALL_LOGS/$tag-registry.log"; then
import os
import ssl
import sys
import urllib.request

url = sys.argv[1]
context = ssl.create_default_context(cafile=os.environ.get('PIP_CERT') or None)
request = urllib.request.Request(url.rstrip('/') + '/pip/',
                                 headers={'Accept': 'text/html'})
try:
    urllib.request.urlopen(request, timeout=30, context=context).close()
except Exception as error:  # noqa: BLE001 (any failure means: not reachable)
    sys.exit(f'{url}: {error}')
PY
        {
            echo "[$tag] the package registry cannot be reached:"
            sed 's/^/    | /' "$MMSOFT_INSTALL_LOGS/$tag-registry.log"
            echo "[$tag]   what to try: check the network, a proxy (HTTPS_PROXY) or the index (pip config list), then run the command again"
        } >&2
        exit 1
    fi
}

# ensure_uv TAG: the lock tool of requirements/lock-tool.txt in $LOCK_VENV
# (default .venv-lock, created when missing; one installer at a time, as
# `make test` starts two at once); sets LOCK_VENV and UV.
ensure_uv() {
    local tag="$1"
    LOCK_VENV="${LOCK_VENV:-.venv-lock}"
    UV="$LOCK_VENV/bin/uv"
    mkdir -p "$LOCK_VENV"
    (
        flock 9
        if [ ! -x "$UV" ]; then
            run_step "$tag" "creating $LOCK_VENV" python3 python3 -m venv "$LOCK_VENV"
            run_step "$tag" "installing the lock tool (requirements/lock-tool.txt)" uv \
                "$LOCK_VENV/bin/python" -m pip install --quiet -r requirements/lock-tool.txt
        fi
    ) 9>"$LOCK_VENV/.installing" || exit 1
}

# python312 [PYTHON...]: the first of PYTHON..., python3.12 on PATH and
# pyenv's CPython 3.12 versions that is a CPython 3.12 with venv, on stdout.
python312() {
    local candidate
    for candidate in "$@" python3.12 \
            "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python3.12; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c \
                'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

# prepare_env TAG KIND VENV PYTHON: before installing the environment KIND
# (env_disk) into VENV: checks the disk (unless VENV's torch is installed)
# and the registry, and creates VENV with PYTHON when it has no python yet.
prepare_env() {
    local tag="$1" kind="$2" venv="$3" py="$4"
    has_torch "$venv" || check_disk "$tag" $(env_disk "$kind") "$venv"
    check_registry "$tag" "$py"
    if [ ! -x "$venv/bin/python" ]; then
        run_step "$tag" "creating the virtual environment $venv" python \
            "$py" -m venv "$venv"
    fi
}

# install_locked TAG VENV LOCK...: exactly what the locks pin, hash-checked
# wheels only, with uv (ensure_uv) from pip's index (package_index), without
# bytecode (warm_up writes that of what is imported; docs/testing.md); its
# cache, hard links into VENV, is removed after.
install_locked() {
    local tag="$1" venv="$2" lock requirements=()
    local cert="${SSL_CERT_FILE:-${PIP_CERT:-}}"  # pip's certificates, if set
    shift 2
    ensure_uv "$tag"
    for lock in "$@"; do requirements+=(-r "$lock"); done
    run_step "$tag" "installing $* (hash-checked wheels)" "$*" \
        env ${cert:+"SSL_CERT_FILE=$cert"} "$UV" pip install \
        --python "$venv/bin/python" --cache-dir "$venv/.uv-cache" \
        --index-url "$(package_index "$venv/bin/python")" --require-hashes \
        --only-binary :all: --no-deps "${requirements[@]}"
    rm -rf "$venv/.uv-cache"
}

# warm_up VENV ARG...: VENV's python with ARG (the install's last check),
# writing the bytecode of the modules it imports, which later processes
# read, even where the shell sets PYTHONDONTWRITEBYTECODE.
warm_up() {
    PYTHONDONTWRITEBYTECODE= "$1/bin/python" "${@:2}"
}

# install_editable TAG VENV: mmsoft from the checkout, built with the
# environment's own pinned setuptools.
install_editable() {
    local tag="$1" venv="$2"
    run_step "$tag" "installing mmsoft (editable)" mmsoft \
        "$venv/bin/python" -m pip install --disable-pip-version-check \
        --no-build-isolation --no-deps -e .
}

# ------------------------------------------------------------------ commands
# install_stack VENV: the stack, mmcv's wheel (built once per key:
# build_mmcv_wheel.sh) and mmsoft, linked where mim reads it.
install_stack() {
    local venv="$1" tag=install key wheels wheel site record
    local py="$venv/bin/python" stamp="$venv/.mmcv-wheel"
    prepare_env "$tag" stack "$venv" python3
    install_locked "$tag" "$venv" requirements/locks/stack.txt
    key=$(bash tools/build_mmcv_wheel.sh key "$py")
    wheels="${MMSOFT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft/wheels}/$key"
    if ls "$wheels"/mmcv-*.whl >/dev/null 2>&1; then
        echo "[$tag] mmcv wheel for this torch and build script found in $wheels"
        bash tools/build_mmcv_wheel.sh prepare "$py"
    else
        echo "[$tag] building mmcv with its ops from source against torch" \
             "$("$py" -c "import torch; print(torch.__version__)") (kept in $wheels afterwards)"
        bash tools/build_mmcv_wheel.sh build "$py" "$wheels"
    fi
    wheel=$(ls "$wheels"/mmcv-*.whl)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wheel" ] || ! "$py" -c "import mmcv.ops" 2>/dev/null; then
        run_step "$tag" "installing $(basename "$wheel")" mmcv "$py" -m pip install \
            --disable-pip-version-check --force-reinstall --no-deps "$wheel"
        "$py" -c "import mmcv.ops" || {
            echo "[$tag] mmcv was installed without its compiled ops ($wheel)" >&2; exit 1; }
        echo "$wheel" > "$stamp"
    fi
    install_editable "$tag" "$venv"
    # mim reads site-packages/mmsoft/.mim: a link to the checkout's package, in
    # the install's RECORD (docs/training.md).
    site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    if [ -e "$site/mmsoft" ] && [ ! -L "$site/mmsoft" ]; then
        echo "[mim] $site/mmsoft is not a link (a regular install?): left as it is" >&2
    else
        ln -sfn "$(pwd)/mmsoft" "$site/mmsoft"
        record=$(ls "$site"/mmsoft-*.dist-info/RECORD)
        grep -qx 'mmsoft,,' "$record" || echo 'mmsoft,,' >> "$record"
    fi
    run_step "$tag" "checking that every installed package's requirements hold (pip check)" \
        "the locked stack" "$py" -m pip check
    warm_up "$venv" -c "import mmsoft, mmdet, mmseg, mmcv.ops; print('[$tag] ok: mmsoft', mmsoft.__version__)"
}

# install_floor VENV: mmdet and mmsegmentation without their dependencies
# (requirements/floor-nodeps.txt): all of them are in the locks.
install_floor() {
    local venv="$1" tag=install-floor
    prepare_env "$tag" floor "$venv" python3
    install_locked "$tag" "$venv" requirements/locks/floor.txt \
        requirements/locks/floor-nodeps.txt
    install_editable "$tag" "$venv"
    warm_up "$venv" - <<'PY'
import importlib.util

import mmcv
import numpy
import torch

import mmdet
import mmseg
import mmsoft

assert torch.__version__.startswith('2.1.'), torch.__version__
assert numpy.__version__.startswith('1.'), numpy.__version__
assert mmcv.__version__ == '2.1.0', mmcv.__version__
assert importlib.util.find_spec('mmcv._ext') is None, \
    'the floor env should hold mmcv-lite (no compiled ops)'
print(f'[install-floor] ok: mmsoft {mmsoft.__version__}, torch {torch.__version__}, '
      f'numpy {numpy.__version__}, mmcv-lite {mmcv.__version__}, '
      f'mmdet {mmdet.__version__}, mmseg {mmseg.__version__}')
PY
}

# newest_base: the interpreter to create the newest environment with, on
# stdout: CPython $NEWEST_PYTHON (python312), else the newest from 3.10 on.
newest_base() {
    local candidate version best='' best_minor=0
    python312 && return 0
    for candidate in python3.14 python3.13 python3.11 python3.10 python3; do
        version=$("$candidate" -c 'import sys; print(sys.version_info[1])' 2>/dev/null) || continue
        if [ "$version" -ge 10 ] && [ "$version" -gt "$best_minor" ]; then
            best=$(command -v "$candidate")
            best_minor=$version
        fi
    done
    [ -n "$best" ] && echo "$best"
}

# install_newest VENV: the newest environment, no OpenMMLab package.
install_newest() {
    local venv="$1" tag=install-newest base="$1/bin/python" version
    if [ ! -x "$base" ]; then
        base=$(newest_base) || {
            echo "[$tag] no Python 3.10 or newer found (wanted CPython $NEWEST_PYTHON:" \
                 "python$NEWEST_PYTHON on PATH or in pyenv's versions)" >&2; exit 1; }
        version=$("$base" -c 'import platform; print(platform.python_version())')
        echo "[$tag] CPython $version ($base)"
        [[ "$version" == "$NEWEST_PYTHON".* ]] || echo "[$tag] CPython $NEWEST_PYTHON not" \
            "found (neither on PATH nor in pyenv's versions): using the newest Python" \
            "there; the lock is resolved for $NEWEST_PYTHON"
    fi
    prepare_env "$tag" newest "$venv" "$base"
    install_locked "$tag" "$venv" requirements/locks/newest.txt
    install_editable "$tag" "$venv"
    run_step "$tag" "checking that every installed package's requirements hold (pip check)" \
        "the locked newest environment" "$venv/bin/python" -m pip check
    warm_up "$venv" - <<'PY'
import importlib.util
import platform

import segmentation_models_pytorch
import timm
import torch
import torchvision
import transformers
from torchvision.ops import nms

import mmsoft

present = [name for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain')
           if importlib.util.find_spec(name) is not None]
assert not present, f'the newest environment should hold no OpenMMLab package: {present}'
boxes = torch.tensor([[0., 0., 2., 2.], [0., 0., 2., 2.1]])
assert nms(boxes, torch.tensor([1., .9]), .5).tolist() == [0], 'torchvision ops'
print(f'[install-newest] ok: mmsoft {mmsoft.__version__}, Python {platform.python_version()}, '
      f'torch {torch.__version__}, torchvision {torchvision.__version__}, '
      f'timm {timm.__version__}, transformers {transformers.__version__}, '
      f'smp {segmentation_models_pytorch.__version__}')
PY
}

# write_locks: requirements/locks/, for x86-64 Linux and CPython 3.11
# (newest.txt: $NEWEST_PYTHON), docs/get_started.md, "Lock files".
write_locks() {
    local tag=lock
    ensure_uv "$tag"
    # compile OUTPUT ARGUMENTS...: `uv pip compile` of the requirement files
    # and options ARGUMENTS, for CPython $LOCK_PYTHON (default 3.11).
    compile() {
        local out="$1"; shift
        run_step "$tag" "writing $out" "$*" \
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
    LOCK_PYTHON=$NEWEST_PYTHON compile requirements/locks/newest.txt requirements/pip.txt \
        requirements/newest.txt
    echo "[$tag] requirements/locks/ written; install with 'make install install-floor install-newest'"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-} $#" in
        "stack 1"|"stack 2") install_stack "${2:-.venv}" ;;
        "floor 1"|"floor 2") install_floor "${2:-.venv-floor}" ;;
        "newest 1"|"newest 2") install_newest "${2:-.venv-newest}" ;;
        "lock 1") write_locks ;;
        check-disks*) check_disks "${@:2}" ;;
        *) sed -n '4,/(`make test`)$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
    esac
fi
