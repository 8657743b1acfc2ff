#!/usr/bin/env bash
# The GPU check on a node without internet, with the node's own Python,
# torch (CUDA build), NumPy and timm, from a bundle written by
# tools/gpu_bundle.sh (`make gpu-bundle`).
#
#   bash tools/gpu_check_offline.sh BUNDLE OUT_DIR [--budget-s N] [--allow-cpu]
#       [--benchmark] [extra arguments of the tool it runs]
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
# --benchmark (or MMSOFT_GPU_CHECK_TOOL=benchmark) runs
# tools/analysis/gpu_benchmark.py instead: the GPU benchmark, the
# eager tables first, then the memory at 1536x1536, Mask R-CNN, the CUDA
# tests, the regions, the other Mask R-CNNs, one 800x1333 image and
# torch.compile, as far as the budget goes. Its total budget is 560 s by
# default: the benchmark gets what is left as its --budget-s and writes
# OUT_DIR/gpu_benchmark.json, OUT_DIR/gpu_benchmark.md and
# OUT_DIR/gpu_benchmark.log the same way. Where the bundle brings mmdet and
# mmcv's ops, it takes mmdet's Swin-T, PVTv2-b2 and Mask R-CNN; otherwise
# timm's and torchvision's.
#
# --allow-cpu (or MMSOFT_GPU_CHECK_DEVICE=cpu) runs the CPU smoke mode
# instead: --device cpu --sizes 64x64 --repeats 1 --warmup 0, every phase
# (tests/test_cuda.py is collected and skipped); with --benchmark,
# --device cpu --smoke. PYTHON=... picks the interpreter (default python3).
#
# Exit status: the check's (0 passed, 1 a test or measurement failed), 2 on
# invalid arguments or an unusable bundle, 3 when torch or the GPU is
# missing, 124 when the total budget ran out (what was measured is kept).
set -uo pipefail
TAG=gpu-check-offline
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUDGET_S=
TOOL=check
[ "${MMSOFT_GPU_CHECK_TOOL:-}" = benchmark ] && TOOL=benchmark
DEVICE=cuda
[ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
# shellcheck source=tools/_offline.sh
source "$ROOT/tools/_offline.sh"

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
        --benchmark) TOOL=benchmark; shift ;;
        --) shift; EXTRA+=("$@"); break ;;
        *) EXTRA+=("$1"); shift ;;
    esac
done
if [ -z "$BUDGET_S" ]; then
    if [ "$TOOL" = benchmark ]; then BUDGET_S=560; else BUDGET_S=420; fi
fi
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

# 3. The check (or the benchmark), under what is left of the budget.
since=$SECONDS
NAME="gpu_$TOOL"
SCRIPT="tools/analysis/$NAME.py"
args=(--out "$OUT/$NAME.json" --markdown "$OUT/$NAME.md")
if [ "$DEVICE" = cpu ] && [ "$TOOL" = benchmark ]; then
    args+=(--device cpu --smoke)
elif [ "$DEVICE" = cpu ]; then
    args+=(--device cpu --sizes 64x64 --repeats 1 --warmup 0)
fi
# The tool's own budget ends 10 s before the hard limit (`timeout`), so that
# it writes its results before it could be killed.
left=$(($(remaining) - 2))
[ "$left" -ge 20 ] || fail 124 "the total budget of $BUDGET_S s is spent before the $TOOL"
if [ "$TOOL" = benchmark ]; then
    args+=(--budget-s "$((left - 10))")
else
    args+=(--total-budget-s "$((left - 10))")
fi
rm -f "$OUT/$NAME.json" "$OUT/$NAME.md"
say "running $SCRIPT ${args[*]}${EXTRA[*]:+ ${EXTRA[*]}} (hard limit ${left} s)"
(cd "$ROOT" && timeout --kill-after=5 "$left" "$PYTHON" "$SCRIPT" \
    "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"}) 2>&1 | tee "$OUT/$NAME.log"
status=${PIPESTATUS[0]}
[ "$status" = 137 ] && status=124
[ "$status" = 124 ] && say "stopped by the total budget of $BUDGET_S s: what was measured is kept"
phase "$TOOL" "$since"

# 4. The phases' times in the table (a table of the log's end when the tool
#    wrote none).
note=""
[ "$status" = 124 ] && note=" (stopped by the total budget)"
{
    if [ ! -s "$OUT/$NAME.md" ]; then
        if [ "$TOOL" = benchmark ]; then echo "# GPU benchmark"; else echo "# GPU check"; fi
        echo
        echo "The $TOOL wrote no table. The end of its output:"
        echo
        echo '```'
        tail -n 40 "$OUT/$NAME.log" 2>/dev/null
        echo '```'
    fi
    echo
    echo "Offline run: exit status $status$note; total $(elapsed) s of a $BUDGET_S s budget. Phases: $(phases_line)."
} >> "$OUT/$NAME.md"
written=()
for name in "$NAME.json" "$NAME.md" "$NAME.log"; do
    [ -f "$OUT/$name" ] && written+=("$OUT/$name")
done
say "written: ${written[*]:-nothing} (total $(elapsed) s)"
exit "$status"
