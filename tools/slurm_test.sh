#!/usr/bin/env bash
# Testing on a Slurm cluster (mmengine's `slurm` launcher, one task per GPU).
#
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#     bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# PYTHON: the interpreter on the nodes (the checkout's .venv/bin/python when it
# exists, else python; see tools/_python.sh).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
TOOLS_DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/_python.sh
. "$TOOLS_DIR/_python.sh"
export PYTHONPATH="$(dirname "$TOOLS_DIR")${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # SRUN_ARGS holds several words on purpose
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres="gpu:$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS:-} \
    "$PYTHON" -u "$TOOLS_DIR/test.py" "$CONFIG" "$CHECKPOINT" \
    --launcher=slurm "$@"
