# Sourced by the installers (tools/install_*env.sh, build_mmcv_wheel.sh,
# lock.sh) and tools/gpu_node.sh pack; their steps log into
# $MMSOFT_INSTALL_LOGS (install-logs/ in the checkout).

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
# wheels only, with uv (ensure_uv) from pip's index (package_index), bytecode
# compiled (docs/testing.md); its cache, hard links into VENV, is removed after.
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
        --only-binary :all: --no-deps --compile-bytecode "${requirements[@]}"
    rm -rf "$venv/.uv-cache"
}

# install_editable TAG VENV: mmsoft from the checkout, built with the
# environment's own pinned setuptools.
install_editable() {
    local tag="$1" venv="$2"
    run_step "$tag" "installing mmsoft (editable)" mmsoft \
        "$venv/bin/python" -m pip install --disable-pip-version-check \
        --no-build-isolation --no-deps -e .
}

# Run as a command, `bash tools/install_common.sh check-disks TAG VENV:KIND...`
# (`make test`) checks the disk for several environments at once.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        check-disks) shift; check_disks "$@" ;;
        *) echo "usage: bash tools/install_common.sh check-disks TAG VENV:KIND..." >&2; exit 2 ;;
    esac
fi
