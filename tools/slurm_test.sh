#!/usr/bin/env bash
# Testing on a Slurm cluster (mmengine's `slurm` launcher, one task per GPU).
#
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#     bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# PYTHON: the interpreter on the nodes (tools/_python.sh).
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/_python.sh
. "$TOOLS_DIR/_python.sh"
need_args 4 "PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]" "$@"
PARTITION=$1 JOB_NAME=$2 CONFIG=$3 CHECKPOINT=$4
shift 4
slurm_tool "$PARTITION" "$JOB_NAME" "$TOOLS_DIR/test.py" "$CONFIG" "$CHECKPOINT" \
    --launcher=slurm "$@"
