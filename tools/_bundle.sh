# Sourced by the writers of the offline bundles for a GPU node
# (tools/gpu_bundle.sh, tools/gpu_train_bundle.sh), after
# tools/install_common.sh, with TAG, LOCK_VENV, PYTHON_VERSION and PLATFORM
# set (pip's platform tag, e.g. manylinux_2_28_x86_64), and UV (ensure_uv)
# before write_lock.
#
# A bundle is a folder of wheels for the node's Python, each downloaded from
# a lock with its hash (requirements/locks/), listed with its SHA-256 in
# SHA256SUMS; its size is printed and checked against a limit (what one call
# to a GPU node carries).

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

# usage STATUS: the script's header comment (its lines 2 up to `set -euo`).
usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-2}"
}

# parse_mode ARGUMENT...: the positional arguments of a bundle writer:
# `lock` alone (MODE=lock), or at most one OUT_DIR (MODE=bundle; OUT keeps
# its default when none is given).
parse_mode() {
    MODE=bundle
    if [ "${1:-}" = lock ]; then
        MODE=lock
        shift
        [ $# -eq 0 ] || { echo "[$TAG] lock takes no arguments: $* (see --help)" >&2; exit 2; }
    fi
    [ $# -le 1 ] || { echo "[$TAG] one OUT_DIR at most: $* (see --help)" >&2; exit 2; }
    [ $# -eq 0 ] || OUT="$1"
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
