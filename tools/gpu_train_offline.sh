#!/usr/bin/env bash
# Trains Mask R-CNN detectors through mmdet's tools on a GPU node without
# internet, with the node's own Python, torch (CUDA build), NumPy, Pillow,
# OpenCV, SciPy and Matplotlib, from the bundle written by
# tools/gpu_train_bundle.sh (`make gpu-train-bundle`): the demo end to end,
# then three COCO configs timed side by side.
#
#   bash tools/gpu_train_offline.sh BUNDLE OUT_DIR [--budget-s N]
#       [--speed-iters N] [--allow-cpu]
#
# 1. Checks that the python imports torch and sees a CUDA device; otherwise
#    stops at once, exit status 3, saying which: no torch, torch without
#    CUDA, or no GPU visible.
# 2. Checks the bundle (exit status 2 when it is missing, incomplete or not
#    a training bundle) and the node (exit status 3): every package of the
#    bundle's gpu-train-node.txt imports, and the node's torch is the release,
#    for the CUDA release, that the bundle's mmcv was compiled against
#    (gpu-train-manifest.json).
# 3. Installs the bundle into a temporary folder (pip --target --no-index
#    --no-deps; the node's packages are left as they are), the checkout
#    first on PYTHONPATH, and checks mmcv's compiled ops: NMS and RoIAlign on
#    the CPU and on the GPU (tools/analysis/check_mmcv_ops.py).
# 4. The demo, as `make demo` runs it: generates the shapes dataset
#    (data/demo_coco/ in the checkout, seed 0), trains
#    configs/demo/mask-rcnn_soft-tiny_fpn_demo.py (SOFT++ Mask R-CNN) with
#    tools/train.py --amp, evaluates its last checkpoint with tools/test.py
#    (COCO bbox and segm mAP) and checks bbox mAP against the demo's floor
#    (MIN_BBOX_MAP, default 0.25) with tools/analysis/check_metric.py.
# 5. Speed: SOFT++-tiny's and UFO-ViT-tiny's COCO Mask R-CNN configs and
#    mmdet's Swin-T Mask R-CNN config (swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco),
#    each trained with --amp for --speed-iters iterations (default 60) on the
#    demo data: batch 2, the configs' own pipeline (the 160-pixel images
#    resized to 800x800), no pretrained weights, no validation, logged every
#    10 iterations.
# 6. Writes OUT_DIR/gpu_train.md and OUT_DIR/gpu_train.json
#    (tools/analysis/gpu_train_table.py): seconds per iteration (the first
#    logged interval left out), images per second, time against Swin-T, peak
#    GPU memory and the demo's mAP, with the time of each phase. Every step's
#    output also goes to OUT_DIR/gpu_train.log; the work directories are in
#    WORK_ROOT (default work_dirs/gpu_train in the checkout).
#
# A hard total budget (--budget-s, default 540 s, install included): each
# step gets what is left and is stopped when it runs out; the table is
# written with what was measured.
#
# --allow-cpu (or MMSOFT_GPU_CHECK_DEVICE=cpu) runs a CPU smoke mode of the
# same steps: without --amp (mmengine's AMP needs a GPU), the demo for one
# epoch of 16 images (2 iterations) evaluated on 8, no mAP floor, 2 speed
# iterations logged one by one. PYTHON=... picks the interpreter (default
# python3).
#
# Exit status: 0 every step passed, 1 a step failed or the demo's bbox mAP
# is below its floor, 2 invalid arguments or an unusable bundle, 3 torch,
# the GPU or a package of the node is missing (or the node's torch is not
# the one the bundle was built for), 124 the total budget ran out.
set -uo pipefail
TAG=gpu-train-offline
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUDGET_S=540
SPEED_ITERS=60
MIN_BBOX_MAP="${MIN_BBOX_MAP:-0.25}"
WORK_ROOT="${WORK_ROOT:-$ROOT/work_dirs/gpu_train}"
DEVICE=cuda
[ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
# shellcheck source=tools/_offline.sh
source "$ROOT/tools/_offline.sh"

DEMO_CONFIG=configs/demo/mask-rcnn_soft-tiny_fpn_demo.py
# label, config (mmdet:: names a config of mmdet's wheel).
SPEED_RUNS=(
    "soft++-tiny configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py"
    "ufo-vit-tiny configs/ufo_vit/mask-rcnn_ufo-vit-tiny_fpn_1x_coco.py"
    "swin-t mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py"
)

case "${1:-}" in -h|--help) usage 0 ;; esac
[ $# -ge 2 ] && [[ "$1" != -* ]] && [[ "$2" != -* ]] || usage 2
BUNDLE_ARG="$1"
OUT="$2"
shift 2
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) BUDGET_S="${2:-}"; shift 2 || shift ;;
        --budget-s=*) BUDGET_S="${1#*=}"; shift ;;
        --speed-iters) SPEED_ITERS="${2:-}"; shift 2 || shift ;;
        --speed-iters=*) SPEED_ITERS="${1#*=}"; shift ;;
        --allow-cpu) DEVICE=cpu; shift ;;
        -h|--help) usage 0 ;;
        *) fail 2 "unknown argument: $1 (accepted: --budget-s N, --speed-iters N, --allow-cpu; see --help)" ;;
    esac
done
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 60 ] \
    || fail 2 "--budget-s $BUDGET_S: expected whole seconds, 60 or more"
[[ "$SPEED_ITERS" =~ ^[0-9]+$ ]] && [ "$SPEED_ITERS" -ge 2 ] && [ "$SPEED_ITERS" -le 300 ] \
    || fail 2 "--speed-iters $SPEED_ITERS: expected a whole number of iterations from 2 to 300"
[[ "$MIN_BBOX_MAP" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] \
    || fail 2 "MIN_BBOX_MAP=$MIN_BBOX_MAP: expected a number from 0 to 1"

# 1. torch and the device.
since=$SECONDS
require_device
phase device "$since"

# 2. The bundle and the node.
since=$SECONDS
check_bundle "$BUNDLE_ARG" "write it with 'make gpu-train-bundle'"
for name in gpu-train-manifest.json gpu-train-node.txt; do
    [ -f "$BUNDLE/$name" ] || fail 2 "bundle $BUNDLE has no $name: not a training bundle (write one with 'make gpu-train-bundle')"
done
ls "$BUNDLE"/mmcv-*.whl >/dev/null 2>&1 \
    || fail 2 "bundle $BUNDLE holds no mmcv wheel (write it with 'make gpu-train-bundle')"
node=$(timeout 300 "$PYTHON" - "$BUNDLE" 2>&1 <<'PY'
import importlib
import json
import os
import re
import sys

import torch

bundle = sys.argv[1]
# Distributions whose import name is not their own.
MODULES = {'pillow': 'PIL', 'opencv-python': 'cv2', 'opencv-python-headless': 'cv2'}
try:
    with open(os.path.join(bundle, 'gpu-train-manifest.json')) as file:
        built = json.load(file)['mmcv']
    built_torch, built_cuda = built['torch'], built['cuda']
except (OSError, ValueError, KeyError) as error:
    print(f'bundle: gpu-train-manifest.json is unreadable ({type(error).__name__}: {error})')
    sys.exit(2)
problems = []
release = lambda version: '.'.join(version.split('+')[0].split('.')[:2])  # noqa: E731
node_cuda = torch.version.cuda or 'none'
if (release(torch.__version__) != release(built_torch)
        or node_cuda.split('.')[0] != str(built_cuda).split('.')[0]):
    problems.append(
        f"the node's torch {torch.__version__} (CUDA {node_cuda}) is not the torch the "
        f"bundle's mmcv was compiled against, {built_torch} (CUDA {built_cuda}): make the "
        'bundle with that torch (requirements/gpu-train-build.txt)')
wanted = {}
with open(os.path.join(bundle, 'gpu-train-node.txt')) as file:
    for line in file:
        name = re.match(r'[A-Za-z0-9][A-Za-z0-9._-]*', line)
        if name:
            module = MODULES.get(name.group(0).lower(), name.group(0).replace('-', '_'))
            wanted.setdefault(module, []).append(name.group(0))
for module, names in wanted.items():
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure: the node cannot provide it
        problems.append(f"missing on the node: {' or '.join(names)} (import {module}: "
                        f'{type(error).__name__}: {error})')
if problems:
    print('; '.join(problems))
    sys.exit(3)
print(f"the node provides {', '.join(sorted(wanted))}; torch {torch.__version__} matches "
      f"the bundle's mmcv ({built_torch})")
PY
)
case $? in
    0) say "$node" ;;
    2) fail 2 "$node" ;;
    3) fail 3 "$node. The bundle takes these from the node's Python: install them there, or carry their wheels (docs/gpu.md)." ;;
    *) fail 3 "checking the node's packages with $PYTHON failed: $node" ;;
esac
mkdir -p "$OUT" "$WORK_ROOT" || fail 2 "cannot create $OUT or $WORK_ROOT"
OUT="$(cd "$OUT" && pwd)"
WORK_ROOT="$(cd "$WORK_ROOT" && pwd)"
LOG="$OUT/gpu_train.log"
: > "$LOG"
install_bundle "$OUT"
CUDA_VERSION=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["mmcv"]["cuda"])' \
    "$BUNDLE/gpu-train-manifest.json")
ops_args=(--cuda-version "$CUDA_VERSION")
[ "$DEVICE" = cuda ] && ops_args+=(--require-cuda)
(cd "$ROOT" && "$PYTHON" tools/analysis/check_mmcv_ops.py "${ops_args[@]}") 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || fail 1 "mmcv's compiled ops do not run (log: $LOG)"
phase install "$since"

# step NAME COMMAND...: runs COMMAND in the checkout under what is left
# of the budget (less RESERVE_S for what follows), its output into the log;
# sets STEP_STATUS (124 when the budget stopped it, or when none was left).
RESERVE_S=15
step() {
    local name="$1" left
    shift
    left=$(($(remaining) - RESERVE_S))
    if [ "$left" -lt 10 ]; then
        say "$name: skipped, the budget is spent"
        STEP_STATUS=skipped
        return
    fi
    say "$name: $* (at most $left s)" | tee -a "$LOG"
    (cd "$ROOT" && timeout --kill-after=5 "$left" "$@") >> "$LOG" 2>&1
    STEP_STATUS=$?
    [ "$STEP_STATUS" = 137 ] && STEP_STATUS=124
    [ "$STEP_STATUS" = 0 ] || { say "$name: exit status $STEP_STATUS (log: $LOG)"; tail -n 15 "$LOG" >&2; }
}
# failed STATUS: the command's exit status after a step that did not pass: 1
# for a failure, whatever else happened; else 124 for a step that the budget
# stopped or left out.
FAILED=0
failed() {
    case "$1" in
        124|skipped) [ "$FAILED" = 1 ] || FAILED=124 ;;
        *) FAILED=1 ;;
    esac
}

AMP=(--amp)
DEMO_TRAIN=()
DEMO_TEST=()
SPEED_LOG_INTERVAL=10
if [ "$DEVICE" = cpu ]; then
    AMP=()
    DEMO_TRAIN=(--cfg-options train_cfg.max_epochs=1 train_cfg.val_interval=100
                train_dataloader.dataset.indices=16 default_hooks.logger.interval=1)
    DEMO_TEST=(--cfg-options test_dataloader.dataset.indices=8)
    SPEED_ITERS=2
    SPEED_LOG_INTERVAL=1
fi

# 4. The demo.
since=$SECONDS
DEMO_DIR="$WORK_ROOT/demo"
rm -rf "$DEMO_DIR"
step data "$PYTHON" tools/generate_demo_data.py coco --seed 0
demo_status=$STEP_STATUS
if [ "$demo_status" = 0 ]; then
    step demo-train "$PYTHON" tools/train.py "$DEMO_CONFIG" --work-dir "$DEMO_DIR" \
        ${AMP[@]+"${AMP[@]}"} ${DEMO_TRAIN[@]+"${DEMO_TRAIN[@]}"}
    demo_status=$STEP_STATUS
fi
if [ "$demo_status" = 0 ]; then
    step demo-test "$PYTHON" tools/test.py "$DEMO_CONFIG" "$(cat "$DEMO_DIR/last_checkpoint")" \
        --work-dir "$DEMO_DIR" ${DEMO_TEST[@]+"${DEMO_TEST[@]}"}
    demo_status=$STEP_STATUS
fi
if [ "$demo_status" = 0 ] && [ "$DEVICE" = cuda ]; then
    step demo-check "$PYTHON" tools/analysis/check_metric.py "$DEMO_DIR" coco/bbox_mAP "$MIN_BBOX_MAP"
    demo_status=$STEP_STATUS
fi
[ "$demo_status" = 0 ] || failed "$demo_status"
phase demo "$since"

# 5. Speed: three configs on the demo data, the same schedule and size.
since=$SECONDS
# The demo data's classes, from its annotations, in the order of their ids.
CLASSES=$("$PYTHON" -c 'import json, sys
categories = sorted(json.load(open(sys.argv[1]))["categories"], key=lambda c: c["id"])
print(",".join(c["name"] for c in categories))' "$ROOT/data/demo_coco/annotations/instances_train.json" 2>>"$LOG")
if [ -z "$CLASSES" ]; then
    say "speed: no classes in $ROOT/data/demo_coco/annotations/instances_train.json: the speed runs are left out (log: $LOG)"
    failed 1
    SPEED_RUNS=()
fi
NUM_CLASSES=$(echo "$CLASSES" | tr ',' '\n' | wc -l)
SPEED_OPTIONS=(
    train_dataloader.batch_size=2
    train_dataloader.dataset.data_root=data/demo_coco/
    train_dataloader.dataset.ann_file=annotations/instances_train.json
    train_dataloader.dataset.data_prefix.img=train/
    "train_dataloader.dataset.metainfo.classes=($CLASSES)"
    "train_dataloader.dataset.indices=$((2 * SPEED_ITERS))"
    "model.roi_head.bbox_head.num_classes=$NUM_CLASSES"
    "model.roi_head.mask_head.num_classes=$NUM_CLASSES"
    model.backbone.init_cfg=None
    train_cfg.max_epochs=1
    val_dataloader=None val_cfg=None val_evaluator=None
    "default_hooks.logger.interval=$SPEED_LOG_INTERVAL"
    default_hooks.checkpoint.interval=1000 default_hooks.checkpoint.save_last=False
)
MMDET_CONFIGS=$(cd "$ROOT" && "$PYTHON" -c 'import mmdet, os; print(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs"))')
table_runs=()
for item in ${SPEED_RUNS[@]+"${SPEED_RUNS[@]}"}; do
    read -r label config <<<"$item"
    case "$config" in mmdet::*) config="$MMDET_CONFIGS/${config#mmdet::}" ;; esac
    rm -rf "$WORK_ROOT/speed-$label"
    step "speed-$label" "$PYTHON" tools/train.py "$config" --work-dir "$WORK_ROOT/speed-$label" \
        ${AMP[@]+"${AMP[@]}"} --cfg-options "${SPEED_OPTIONS[@]}"
    [ "$STEP_STATUS" = 0 ] || failed "$STEP_STATUS"
    table_runs+=(--run "label=$label" "work_dir=$WORK_ROOT/speed-$label" batch=2 size=800x800
                 "status=$STEP_STATUS" "config=$config")
done
phase speed "$since"

# 6. The table.
device_line=$("$PYTHON" -c 'import torch, sys
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU smoke mode)"
print(f"{name}; torch {torch.__version__}; Python {sys.version.split()[0]}")')
(cd "$ROOT" && "$PYTHON" tools/analysis/gpu_train_table.py --out "$OUT" --device "$device_line" \
    --skip 1 \
    --run label=demo "work_dir=$DEMO_DIR" batch=8 size=160x160 "metrics=$DEMO_DIR" \
        "status=$demo_status" "config=$DEMO_CONFIG" \
    ${table_runs[@]+"${table_runs[@]}"} \
    --note "Demo: $DEMO_CONFIG${AMP[*]:+ (--amp)}, bbox mAP floor $MIN_BBOX_MAP$([ "$DEVICE" = cpu ] && echo ' (not checked in the CPU smoke mode)')." \
    --note "Speed runs: --cfg-options ${SPEED_OPTIONS[*]}" \
    --note "Offline run: total $(elapsed) s of a $BUDGET_S s budget. Phases: $(phases_line).") \
    || failed 1
say "written: $OUT/gpu_train.md, $OUT/gpu_train.json, $LOG (total $(elapsed) s)"
exit "$FAILED"
