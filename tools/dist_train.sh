#!/usr/bin/env bash
# Distributed training with torchrun (mmengine's `pytorch` launcher).
#
# Usage: bash tools/dist_train.sh CONFIG NPROC [tools/train.py options]
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
#              PORT (29500), PYTHON (tools/_python.sh).
# The backend is the config's (mmengine's default: NCCL) on GPUs, gloo on
# a machine without CUDA (mmsoft.apis.setup_cpu_distributed).
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/_python.sh
. "$TOOLS_DIR/_python.sh"
need_args 2 "CONFIG NPROC [train.py options]" "$@"
CONFIG=$1 NPROC=$2
shift 2
torchrun_tool "$NPROC" "$TOOLS_DIR/train.py" "$CONFIG" --launcher pytorch "$@"
