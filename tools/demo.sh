#!/usr/bin/env bash
# End-to-end demo: generate the shapes dataset, train Mask R-CNN with a SOFT
# backbone on it, evaluate with COCO's metric and paint predictions on the
# validation images.
#
# Usage: bash tools/demo.sh          (run from anywhere)
# Environment:
#   CONFIG    demo config (configs/demo/mask-rcnn_soft-tiny_fpn_demo.py)
#   WORK_DIR  logs and checkpoints (work_dirs/<config name>)
#   SHOW_DIR  painted predictions (outputs/<config name>/predictions)
#   SEED      data generator seed (0)
#   TRAIN_SEED  training seed (the config's: 0)
#   MIN_BBOX_MAP  the least bbox mAP that passes (0.25; docs/get_started.md)
#   PYTHON    interpreter (tools/_python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/_python.sh
. tools/_python.sh
CONFIG=${CONFIG:-configs/demo/mask-rcnn_soft-tiny_fpn_demo.py}
NAME=$(basename "$CONFIG" .py)
WORK_DIR=${WORK_DIR:-work_dirs/$NAME}
SHOW_DIR=${SHOW_DIR:-outputs/$NAME/predictions}
SEED=${SEED:-0}
MIN_BBOX_MAP=${MIN_BBOX_MAP:-0.25}

step() { printf '\n==> %s\n' "$*"; }

step "[1/4] generating the COCO-format shapes dataset (data/demo_coco/, seed $SEED)"
"$PYTHON" tools/generate_demo_data.py coco --seed "$SEED"

step "[2/4] training $CONFIG (logs and checkpoints in $WORK_DIR)"
start=$(date +%s)
"$PYTHON" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" \
    ${TRAIN_SEED:+--cfg-options "randomness.seed=$TRAIN_SEED"}
echo "training took $(( $(date +%s) - start )) s"

CHECKPOINT=$(cat "$WORK_DIR/last_checkpoint")
step "[3/4] evaluating $CHECKPOINT with CocoMetric and painting predictions"
rm -rf "$SHOW_DIR"
"$PYTHON" tools/test.py "$CONFIG" "$CHECKPOINT" --work-dir "$WORK_DIR" \
    --show-dir "$SHOW_DIR"

count=$(find "$SHOW_DIR" -name '*.png' -o -name '*.jpg' | wc -l)
step "[4/4] checking the result: bbox mAP at least $MIN_BBOX_MAP"
"$PYTHON" tools/analysis/check_metric.py "$WORK_DIR" coco/bbox_mAP "$MIN_BBOX_MAP"
step "done: $count painted validation images in $(cd "$SHOW_DIR" && pwd)"
