# Sourced by the commands that run on a GPU node without internet, from a
# bundle of wheels (tools/gpu_check_offline.sh, tools/gpu_train_offline.sh),
# with TAG, ROOT (the checkout), BUDGET_S and DEVICE (cuda or cpu) set. Sets
# PYTHON (the node's interpreter: $PYTHON, default python3, a relative path
# made absolute), START and PHASES, the time of each phase for the command's
# report.
PYTHON="${PYTHON:-python3}"
case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; esac
START=$SECONDS
PHASES=()

say() { echo "[$TAG] $*"; }
fail() { local code="$1"; shift; echo "[$TAG] $*" >&2; exit "$code"; }
# usage STATUS: the command's header comment (its lines 2 up to `set -uo`),
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
