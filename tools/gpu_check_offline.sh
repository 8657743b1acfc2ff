#!/usr/bin/env bash
# The GPU check on a node without internet, with the node's own Python,
# torch (CUDA build), NumPy and timm, from a bundle written by
# tools/gpu_bundle.sh (`make gpu-bundle`).
#
#   bash tools/gpu_check_offline.sh BUNDLE OUT_DIR [--budget-s N] [--allow-cpu]
#       [extra arguments of tools/analysis/gpu_check.py]
#
# 1. Checks that the python imports torch and sees a CUDA device; otherwise
#    stops at once, exit status 3, saying which: no torch, torch without
#    CUDA, or no GPU visible.
# 2. Installs the bundle's wheels into a temporary folder (pip --target
#    --no-index --no-deps; the node's packages are left as they are) and
#    puts the checkout, then that folder, first on PYTHONPATH: the check runs
#    the checkout's mmsoft, the revision of the tests it runs.
# 3. Runs tools/analysis/gpu_check.py (the CUDA tests, then the benchmark)
#    under a hard total budget (--budget-s, default 420 s, install
#    included): the check gets what is left as its --total-budget-s and is
#    killed 10 s after. It writes OUT_DIR/gpu_check.json and
#    OUT_DIR/gpu_check.md (the table) after every measurement; its output
#    also goes to OUT_DIR/gpu_check.log.
# 4. Adds the time of each phase to OUT_DIR/gpu_check.md (or, when the
#    check wrote no table, writes one with the end of its log).
#
# --allow-cpu (or MMSOFT_GPU_CHECK_DEVICE=cpu) runs the CPU smoke mode
# instead: --device cpu --sizes 64x64 --repeats 1 --warmup 0, every phase
# (tests/test_cuda.py is collected and skipped). PYTHON=... picks the
# interpreter (default python3).
#
# Exit status: the check's (0 passed, 1 a test or measurement failed), 2 on
# invalid arguments or an unusable bundle, 3 when torch or the GPU is
# missing, 124 when the total budget ran out (what was measured is kept).
set -uo pipefail
TAG=gpu-check-offline
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; esac
BUDGET_S=420
DEVICE=cuda
[ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
START=$SECONDS
PHASES=()

say() { echo "[$TAG] $*"; }
fail() { local code="$1"; shift; echo "[$TAG] $*" >&2; exit "$code"; }
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

case "${1:-}" in -h|--help) usage 0 ;; esac
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
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 30 ] \
    || fail 2 "--budget-s $BUDGET_S: expected whole seconds, 30 or more"

# 1. torch and the device.
since=$SECONDS
command -v "$PYTHON" >/dev/null 2>&1 \
    || fail 3 "no torch: PYTHON=$PYTHON cannot be run (not found). Point PYTHON at the node's python that has torch."
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
probe_status=$?
case "$probe_status" in
    0) say "$probe" ;;
    11|12)
        if [ "$DEVICE" = cpu ]; then
            say "$probe; CPU smoke mode (--allow-cpu)"
        else
            fail 3 "$probe. Run on a node with a GPU and its CUDA build of torch, or pass --allow-cpu for the CPU smoke mode."
        fi ;;
    10) fail 3 "$probe. The check uses the node's own torch: activate the environment that has it, or set PYTHON=..." ;;
    124) fail 3 "no torch: importing torch in $PYTHON took over 120 s" ;;
    *) fail 3 "no torch: $PYTHON exited with status $probe_status while importing torch" ;;
esac
phase device "$since"

[ "$DEVICE" = cpu ] && [ "$probe_status" = 0 ] && say "CPU smoke mode (--allow-cpu)"

# 2. The bundle, installed into a temporary folder.
since=$SECONDS
[ -d "$BUNDLE" ] || fail 2 "bundle $BUNDLE: no such folder (write it with 'make gpu-bundle')"
BUNDLE="$(cd "$BUNDLE" && pwd)"
shopt -s nullglob
wheels=("$BUNDLE"/*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -gt 0 ] || fail 2 "bundle $BUNDLE holds no wheels"
for wheel in "${wheels[@]}"; do
    case "$(basename "$wheel")" in
        torch-*|torchvision-*|numpy-*|timm-*|triton-*|nvidia_*)
            fail 2 "bundle $BUNDLE holds $(basename "$wheel"): the node's own is used, remove it" ;;
    esac
done
if [ -f "$BUNDLE/SHA256SUMS" ] && command -v sha256sum >/dev/null; then
    (cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS) \
        || fail 2 "bundle $BUNDLE does not match its SHA256SUMS (an incomplete copy?)"
fi
mkdir -p "$OUT" || fail 2 "cannot create $OUT"
OUT="$(cd "$OUT" && pwd)"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/mmsoft-gpu-check.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
SITE="$TMP/site"
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    timeout "$(remaining)" "$PYTHON" -m pip install --isolated --disable-pip-version-check \
        --no-index --no-deps --no-warn-script-location --target "$SITE" "${wheels[@]}" \
        >"$OUT/install.log" 2>&1 \
        || { tail -n 20 "$OUT/install.log" >&2; fail 2 "installing the bundle failed (log: $OUT/install.log)"; }
else
    # No pip: the wheels (pure Python) unpacked as they are.
    "$PYTHON" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$SITE" "${wheels[@]}" \
        >"$OUT/install.log" 2>&1 || fail 2 "unpacking the bundle failed (log: $OUT/install.log)"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
say "installed ${#wheels[@]} wheels into $SITE"
phase install "$since"

# 3. The check, under what is left of the budget.
since=$SECONDS
args=(--out "$OUT/gpu_check.json" --markdown "$OUT/gpu_check.md")
[ "$DEVICE" = cpu ] && args+=(--device cpu --sizes 64x64 --repeats 1 --warmup 0)
# The check's own budget ends 10 s before the hard limit (`timeout`), so that
# it writes its results before it could be killed.
left=$(($(remaining) - 2))
[ "$left" -ge 20 ] || fail 124 "the total budget of $BUDGET_S s is spent before the check"
args+=(--total-budget-s "$((left - 10))")
rm -f "$OUT/gpu_check.json" "$OUT/gpu_check.md"
say "running tools/analysis/gpu_check.py ${args[*]}${EXTRA[*]:+ ${EXTRA[*]}} (hard limit ${left} s)"
(cd "$ROOT" && timeout --kill-after=5 "$left" "$PYTHON" tools/analysis/gpu_check.py \
    "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"}) 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
[ "$status" = 137 ] && status=124
[ "$status" = 124 ] && say "stopped by the total budget of $BUDGET_S s: what was measured is kept"
phase check "$since"

# 4. The phases' times in the table (a table of the log's end when the check
#    wrote none).
note=""
[ "$status" = 124 ] && note=" (stopped by the total budget)"
{
    if [ ! -s "$OUT/gpu_check.md" ]; then
        echo "# GPU check"
        echo
        echo "The check wrote no table. The end of its output:"
        echo
        echo '```'
        tail -n 40 "$OUT/gpu_check.log" 2>/dev/null
        echo '```'
    fi
    echo
    phases=""
    for item in "${PHASES[@]}"; do
        phases+="${phases:+, }${item%%=*} ${item#*=} s"
    done
    echo "Offline run: exit status $status$note; total $(elapsed) s of a $BUDGET_S s budget. Phases: $phases."
} >> "$OUT/gpu_check.md"
written=()
for name in gpu_check.json gpu_check.md gpu_check.log; do
    [ -f "$OUT/$name" ] && written+=("$OUT/$name")
done
say "written: ${written[*]:-nothing} (total $(elapsed) s)"
exit "$status"
