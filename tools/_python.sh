# Sourced by the shell launchers (tools/*.sh): PYTHON, when not set, is the
# checkout's .venv/bin/python (links to tools/ followed) where it exists, else
# python; and the steps that dist_*.sh and slurm_*.sh share.
if [ -z "${PYTHON:-}" ]; then
    PYTHON="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
    [ -x "$PYTHON" ] || PYTHON=python
fi

# need_args COUNT USAGE ARG...: exits with status 2, printing USAGE, unless
# there are COUNT ARGs or more.
need_args() {
    [ $# -ge $(($1 + 2)) ] && return 0
    echo "usage: $0 $2" >&2
    exit 2
}

# torchrun_tool NPROC TOOL ARG...: the Python tool TOOL (tools/train.py,
# tools/test.py) in NPROC processes of torchrun, its checkout first on
# PYTHONPATH.
torchrun_tool() {
    export PYTHONPATH="$(dirname "$(dirname "$2")")${PYTHONPATH:+:$PYTHONPATH}"
    exec "$PYTHON" -m torch.distributed.run --nnodes="${NNODES:-1}" \
        --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --master_port="${PORT:-29500}" --nproc_per_node="$1" "${@:2}"
}

# slurm_tool PARTITION JOB_NAME TOOL ARG...: the Python tool TOOL in one Slurm
# task per GPU (GPUS, default 8; GPUS_PER_NODE, 8; CPUS_PER_TASK, 5; and
# SRUN_ARGS), its checkout first on PYTHONPATH.
slurm_tool() {
    export PYTHONPATH="$(dirname "$(dirname "$3")")${PYTHONPATH:+:$PYTHONPATH}"
    # shellcheck disable=SC2086  # SRUN_ARGS holds several words on purpose
    srun -p "$1" --job-name="$2" --gres="gpu:${GPUS_PER_NODE:-8}" \
        --ntasks="${GPUS:-8}" --ntasks-per-node="${GPUS_PER_NODE:-8}" \
        --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
        "$PYTHON" -u "${@:3}"
}
