#!/usr/bin/env bash
# Distributed testing with torchrun (mmengine's `pytorch` launcher).
#
# Usage: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [tools/test.py options]
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
#              PORT (29500), PYTHON (tools/_python.sh).
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/_python.sh
. "$TOOLS_DIR/_python.sh"
need_args 3 "CONFIG CHECKPOINT NPROC [test.py options]" "$@"
CONFIG=$1 CHECKPOINT=$2 NPROC=$3
shift 3
torchrun_tool "$NPROC" "$TOOLS_DIR/test.py" "$CONFIG" "$CHECKPOINT" \
    --launcher pytorch "$@"
