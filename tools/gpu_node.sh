#!/usr/bin/env bash
# A GPU node without internet (docs/gpu.md): a bundle of wheels packed here,
# run there with the node's own Python and torch (its Python: gpu_node.py).
#
# bash tools/gpu_node.sh COMMAND, COMMAND one of:
#   pack check [OUT_DIR] [--python-version V] [--platform P]   (make gpu-bundle)
#   pack train [OUT_DIR]   (make gpu-train-bundle: mmcv with its CUDA ops for
#       TORCH_CUDA_ARCH_LIST, default "8.0;9.0", and gpu-train-manifest.json)
#   lock check|train   (make gpu-bundle-lock, gpu-train-bundle-lock)
#   run check BUNDLE OUT_DIR [--budget-s N] [--allow-cpu] [benchmark options]
#   run train BUNDLE OUT_DIR [--budget-s N] [--speed-iters N] [--allow-cpu]
#
# run: PYTHON (default python3) must import torch and see a GPU (--allow-cpu or
# MMSOFT_GPU_CHECK_DEVICE=cpu: the CPU smoke mode); MIN_BBOX_MAP, MMSOFT_COMMIT.
# pack: LOCK_VENV, MAX_JOBS, MMSOFT_INSTALL_LOGS, MMSOFT_GPU_BUILD_DIR,
# MMSOFT_WHEEL_CACHE, MMSOFT_PYTHON312.
# Exit status: 0; 1 a step failed (or the demo's mAP is under its floor); 2
# invalid arguments or an unusable bundle; 3 torch, the GPU or a node package
# missing, or the node's torch not the bundle's; 124 the budget ran out.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TAG=gpu-node
TARGET_PYTHON=3.12
TARGET_PLATFORM=manylinux_2_28_x86_64

say() { echo "[$TAG] $*"; }
fail() {
    echo "[$TAG] ${*:2}" >&2
    exit "$1"
}
# usage STATUS: the header above, on standard output for --help (STATUS 0).
usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&$(($1 ? 2 : 1))
    exit "$1"
}
# names KIND: sets BUNDLE_NAME (of its requirements and lock) and MAKE_TARGET.
names() {
    BUNDLE_NAME=gpu-bundle MAKE_TARGET=gpu-bundle
    [ "$1" = check ] || BUNDLE_NAME=gpu-train MAKE_TARGET=gpu-train-bundle
}

# ---------------------------------------------------------------- pack, lock
# write_lock OUTPUT REQUIREMENTS [UV_OPTION...]: REQUIREMENTS resolved for the
# target with every file's hash, wheels only, the target in its third line.
write_lock() {
    local out="$1" requirements="$2" resolved
    shift 2
    resolved="$(mktemp)"
    run_step "$TAG" "writing $out (CPython $PYTHON_VERSION, $PLATFORM)" "$requirements" \
        "$UV" pip compile --quiet --python-version "$PYTHON_VERSION" \
        --python-platform "$UV_PLATFORM" --generate-hashes --only-binary :all: \
        --custom-compile-command "make $MAKE_TARGET-lock" -o "$resolved" "$@" "$requirements"
    sed "2a # target: CPython $PYTHON_VERSION, $PLATFORM" "$resolved" > "$out"
    rm -f "$resolved"
}

# seal OUT_DIR MAX_BYTES HINT...: writes OUT_DIR/SHA256SUMS of its files and
# lists them; fails, printing HINT, when the folder holds more than MAX_BYTES.
seal() {
    local bytes
    (cd "$1" && rm -f SHA256SUMS && sha256sum -- * > SHA256SUMS \
        && ls -l -- * | awk '{ printf "    %10d  %s\n", $5, $9 }')
    bytes=$(du -sb "$1" | cut -f1)
    say "$1: $bytes bytes, limit $2"
    [ "$bytes" -le "$2" ] || fail 1 "the bundle is over the limit: ${*:3}"
}

# build_mmcv OUT_DIR: mmcv with its CUDA ops (from MMSOFT_WHEEL_CACHE, or
# compiled into it with the torch and CUDA 13 compiler of gpu-train-build.txt)
# stripped into OUT_DIR, and the manifest. The CUDA home is made of links, as
# the index's packages have no libcudart.so for the linker's -lcudart.
build_mmcv() {
    local build_dir="${MMSOFT_GPU_BUILD_DIR:-${TMPDIR:-/tmp}/mmsoft-gpu-build}"
    local arch_list="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" base cu13 lib key wheels tmp
    local venv="$build_dir/venv-build"
    local py="$venv/bin/python"
    if [ ! -x "$py" ]; then
        base=$(python312 ${MMSOFT_PYTHON312:+"$MMSOFT_PYTHON312"}) \
            || fail 1 "no CPython 3.12 found (MMSOFT_PYTHON312, python3.12 on PATH," \
                "pyenv's versions): mmcv's wheel is built for the node's Python, 3.12"
        check_disk "$TAG" 7 1 "$venv"
        mkdir -p "$build_dir"
        run_step "$TAG" "creating the build environment $venv ($base)" python \
            "$base" -m venv "$venv"
    fi
    install_locked "$TAG" "$venv" requirements/locks/gpu-train-build.txt
    cu13=$("$py" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
    [ -x "$cu13/bin/nvcc" ] || fail 1 "no nvcc in $cu13/bin (requirements/locks/gpu-train-build.txt)"
    export CUDA_HOME="$build_dir/cuda-home" FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch_list"
    mkdir -p "$CUDA_HOME/lib64"
    for lib in bin include nvvm; do ln -sfn "$cu13/$lib" "$CUDA_HOME/$lib"; done
    for lib in "$cu13"/lib/*.so*; do ln -sfn "$lib" "$CUDA_HOME/lib64/"; done
    ln -sfn "$cu13/lib/libcudart.so.13" "$CUDA_HOME/lib64/libcudart.so"
    key=$(bash tools/build_mmcv_wheel.sh key "$py")
    wheels="${MMSOFT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft/wheels}/$key"
    if ls "$wheels"/mmcv-*.whl >/dev/null 2>&1; then
        say "mmcv's CUDA wheel found in $wheels"
    else
        say "compiling mmcv with its CUDA ops for TORCH_CUDA_ARCH_LIST=$arch_list" \
            "(kept in $wheels; hours on 2 cores)"
        bash tools/build_mmcv_wheel.sh build "$py" "$wheels" || exit 1
    fi
    tmp=$(mktemp -d)
    "$py" -m wheel unpack -d "$tmp" "$wheels"/mmcv-*.whl >/dev/null
    strip --strip-debug "$tmp"/*/mmcv/_ext*.so
    "$py" -m wheel pack -d "$1" "$tmp"/* >/dev/null
    rm -rf "$tmp"
    "$py" tools/gpu_node.py manifest "$1" "$key" "$arch_list" "$CUDA_HOME/bin/nvcc" \
        "$(ls "$wheels"/mmcv-*.whl)" "$PYTHON_VERSION" "$PLATFORM" || exit 1
}

# pack KIND [OUT_DIR] [OPTION...]; with LOCK_ONLY=1, the locks alone.
pack() {
    local kind="$1" out="" lock copy src
    shift
    PYTHON_VERSION=$TARGET_PYTHON PLATFORM=$TARGET_PLATFORM
    while [ $# -gt 0 ]; do
        [ "$LOCK_ONLY" = 0 ] || fail 2 "lock takes no arguments: $* (see --help)"
        case "$kind $1" in
            "check --python-version") PYTHON_VERSION="${2:-}"; shift ;;
            "check --python-version="*) PYTHON_VERSION="${1#*=}" ;;
            "check --platform") PLATFORM="${2:-}"; shift ;;
            "check --platform="*) PLATFORM="${1#*=}" ;;
            *" -"*) fail 2 "unknown option: $1 (see --help)" ;;
            *) [ -z "$out" ] || fail 2 "one OUT_DIR at most: $out $1 (see --help)"
               out="$1" ;;
        esac
        shift
    done
    # pip's platform tag (manylinux_2_28_x86_64) or uv's (x86_64-manylinux_2_28)
    [[ "$PLATFORM" =~ ^(x86_64|aarch64)-(manylinux.*)$ ]] \
        && PLATFORM="${BASH_REMATCH[2]}_${BASH_REMATCH[1]}"
    [[ "$PLATFORM" =~ ^(manylinux.*)_(x86_64|aarch64)$ ]] \
        || fail 2 "--platform $PLATFORM: expected a manylinux tag such as $TARGET_PLATFORM"
    UV_PLATFORM="${BASH_REMATCH[2]}-${BASH_REMATCH[1]}"
    [[ "$PYTHON_VERSION" =~ ^3\.[0-9]+$ ]] \
        || fail 2 "--python-version $PYTHON_VERSION: expected e.g. $TARGET_PYTHON"
    [ "$kind" = check ] || [[ "${TORCH_CUDA_ARCH_LIST:-8.0}" =~ ^[0-9]+\.[0-9]+(\+PTX)?([\;\ ][0-9]+\.[0-9]+(\+PTX)?)*$ ]] \
        || fail 2 "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST: expected compute capabilities" \
            "separated by ';', e.g. \"8.0;9.0\""
    cd "$ROOT" || exit 1
    source tools/install.sh
    set -e
    ensure_uv "$TAG"
    names "$kind"
    lock=requirements/locks/$BUNDLE_NAME.txt copy=$BUNDLE_NAME-lock.txt
    out="${out:-work_dirs/${MAKE_TARGET//-/_}}"
    if [ "$LOCK_ONLY" = 1 ] || [ ! -f "$lock" ]; then
        if [ "$kind" = check ]; then
            write_lock "$lock" requirements/gpu-bundle.txt
        else  # the node's packages and mmcv (built) overridden: a marker never true
            src="$(mktemp)"
            sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\).*/\1; sys_platform == "never"/p' \
                requirements/gpu-train-node.txt > "$src"
            echo 'mmcv; sys_platform == "never"' >> "$src"
            write_lock "$lock" requirements/gpu-train.txt --override "$src"
            write_lock requirements/locks/gpu-train-build.txt requirements/gpu-train-build.txt
            rm -f "$src"
        fi
    fi
    [ "$LOCK_ONLY" = 1 ] && exit 0
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    check_registry "$TAG" "$LOCK_VENV/bin/python"
    rm -f "$out"/*.whl "$out"/gpu-*.txt "$out"/gpu-*.json "$out/SHA256SUMS"
    if [ "$PYTHON_VERSION $PLATFORM" = "$TARGET_PYTHON $TARGET_PLATFORM" ]; then
        cp "$lock" "$out/$copy"
    else
        say "target CPython $PYTHON_VERSION, $PLATFORM: its lock is written into $out only"
        write_lock "$out/$copy" requirements/gpu-bundle.txt
    fi
    run_step "$TAG" "downloading the wheels of $copy into $out (hash-checked)" "$copy" \
        "$LOCK_VENV/bin/python" -m pip download --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: --python-version "$PYTHON_VERSION" \
        --platform "$PLATFORM" --implementation cp -r "$out/$copy" -d "$out"
    if [ "$kind" = check ]; then
        # mmsoft's wheel, from a copy of what it is made of (setup.py copies
        # configs/ and tools/ into mmsoft/.mim).
        src="$(mktemp -d)"
        tar --exclude=__pycache__ --exclude='*.pyc' --exclude=mmsoft/.mim -cf - setup.py \
            setup.cfg README.md LICENSE model-index.yml mmsoft configs tools \
            | tar -xf - -C "$src"
        run_step "$TAG" "building mmsoft's wheel" mmsoft "$UV" build --wheel --quiet \
            --python "$LOCK_VENV/bin/python" --build-constraints \
            requirements/build-constraints.txt --out-dir "$out" "$src"
        rm -rf "$src"
        seal "$out" 60000000 "remove what requirements/gpu-bundle.txt does not need"
    else
        cp requirements/gpu-train-node.txt "$out/"
        build_mmcv "$out"
        seal "$out" 50000000 "leave out what requirements/gpu-train.txt does not need," \
            "or build for fewer architectures"
    fi
    say "copy $out beside the checkout on the node, then run there:"
    echo "    bash tools/gpu_node.sh run $kind $(basename "$out") work_dirs/gpu_${kind}_out"
}

# ------------------------------------------------------------------- run
elapsed() { echo $((SECONDS - START)); }
remaining() { echo $((BUDGET_S - (SECONDS - START))); }
# phase NAME SINCE: records and prints how long a phase took.
phase() {
    PHASES+="${PHASES:+, }$1 $((SECONDS - $2)) s"
    say "$1: $((SECONDS - $2)) s (total $(elapsed) s of $BUDGET_S s)"
}

# parse_run KIND BUNDLE OUT_DIR OPTION...: checks and sets BUNDLE, OUT, BUDGET_S,
# DEVICE, SPEED_ITERS, MIN_BBOX_MAP and EXTRA (run check's benchmark options).
parse_run() {
    local kind="$1" least=30
    [ $# -ge 3 ] && [[ "$2" != -* ]] && [[ "$3" != -* ]] || usage 2
    BUNDLE="$2" OUT="$3" BUDGET_S=560 SPEED_ITERS=60 DEVICE=cuda EXTRA=()
    MIN_BBOX_MAP="${MIN_BBOX_MAP:-0.25}"
    [ "$kind" = train ] && BUDGET_S=540 least=60
    [ "${MMSOFT_GPU_CHECK_DEVICE:-}" = cpu ] && DEVICE=cpu
    shift 3
    while [ $# -gt 0 ]; do
        case "$kind $1" in
            *" --allow-cpu") DEVICE=cpu ;;
            *" --budget-s") BUDGET_S="${2:-}"; shift ;;
            *" --budget-s="*) BUDGET_S="${1#*=}" ;;
            "train --speed-iters") SPEED_ITERS="${2:-}"; shift ;;
            "train --speed-iters="*) SPEED_ITERS="${1#*=}" ;;
            "check "*) EXTRA+=("$1") ;;
            *) fail 2 "unknown argument: $1 (accepted: --budget-s N, --speed-iters N," \
                   "--allow-cpu; see --help)" ;;
        esac
        shift
    done
    [[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge "$least" ] \
        || fail 2 "--budget-s $BUDGET_S: expected whole seconds, $least or more"
    [[ "$SPEED_ITERS" =~ ^[0-9]+$ ]] && [ "$SPEED_ITERS" -ge 2 ] && [ "$SPEED_ITERS" -le 300 ] \
        || fail 2 "--speed-iters $SPEED_ITERS: expected a whole number of iterations from 2 to 300"
    [ "$kind" = check ] || [[ "$MIN_BBOX_MAP" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] \
        || fail 2 "MIN_BBOX_MAP=$MIN_BBOX_MAP: expected a number from 0 to 1"
}

# check_device: the node's python imports torch and sees a GPU (with
# DEVICE=cpu, a torch without one will do); else exit status 3, saying which.
check_device() {
    local line status
    PYTHON="${PYTHON:-python3}"
    case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; esac
    command -v "$PYTHON" >/dev/null 2>&1 || fail 3 "no torch: PYTHON=$PYTHON cannot" \
        "be run (not found). Point PYTHON at the node's python that has torch."
    line=$(timeout 120 "$PYTHON" "$ROOT/tools/gpu_node.py" device 2>/dev/null)
    status=$?
    case "$status" in
        0) say "$line"
           [ "$DEVICE" = cuda ] || say "CPU smoke mode (--allow-cpu)" ;;
        11|12) [ "$DEVICE" = cpu ] || fail 3 "$line. Run on a node with a GPU and its" \
                   "CUDA build of torch, or pass --allow-cpu for the CPU smoke mode."
               say "$line; CPU smoke mode (--allow-cpu)" ;;
        10) fail 3 "$line. The command uses the node's own torch: activate the" \
                "environment that has it, or set PYTHON=..." ;;
        124) fail 3 "no torch: importing torch in $PYTHON took over 120 s" ;;
        *) fail 3 "no torch: $PYTHON exited with status $status while importing torch" ;;
    esac
}

# check_bundle KIND: sets BUNDLE (absolute) and WHEELS, none of the node's own;
# checks SHA256SUMS, a training bundle's files and the node against them.
check_bundle() {
    local hint="write it with 'make $MAKE_TARGET'" wheel node
    [ -d "$BUNDLE" ] || fail 2 "bundle $BUNDLE: no such folder ($hint)"
    BUNDLE="$(cd "$BUNDLE" && pwd)"
    WHEELS=("$BUNDLE"/*.whl)
    [ -e "${WHEELS[0]}" ] || fail 2 "bundle $BUNDLE holds no wheels"
    for wheel in "${WHEELS[@]##*/}"; do
        case "$wheel" in torch-*|torchvision-*|numpy-*|timm-*|triton-*|nvidia_*)
            fail 2 "bundle $BUNDLE holds $wheel: the node's own is used, remove it" ;;
        esac
    done
    if [ -f "$BUNDLE/SHA256SUMS" ]; then
        (cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1) \
            || fail 2 "bundle $BUNDLE does not match its SHA256SUMS (an incomplete copy?)"
    fi
    [ "$1" = train ] || return 0
    [ -f "$BUNDLE/gpu-train-manifest.json" ] && [ -f "$BUNDLE/gpu-train-node.txt" ] \
        || fail 2 "bundle $BUNDLE is not a training bundle (no gpu-train-manifest.json; $hint)"
    ls "$BUNDLE"/mmcv-*.whl >/dev/null 2>&1 \
        || fail 2 "bundle $BUNDLE holds no mmcv wheel ($hint)"
    node=$(timeout 300 "$PYTHON" "$ROOT/tools/gpu_node.py" node "$BUNDLE" 2>&1)
    case $? in
        0) say "$node" ;;
        2) fail 2 "$node" ;;
        3) fail 3 "$node. The bundle takes these from the node's Python: install" \
               "them there, or carry their wheels (docs/gpu.md)." ;;
        *) fail 3 "checking the node's packages with $PYTHON failed: $node" ;;
    esac
}

# start_run KIND ARGS...: the arguments, the device and the bundle checked, the
# wheels installed into a temporary folder (removed on exit), after the
# checkout first on PYTHONPATH; the log is OUT/install.log.
start_run() {
    local kind="$1"
    shift
    START=$SECONDS PHASES=""
    parse_run "$kind" "$@"
    names "$kind"
    check_device
    phase device "$START"
    INSTALL_SINCE=$SECONDS
    check_bundle "$kind"
    mkdir -p "$OUT" || fail 2 "cannot create $OUT"
    OUT="$(cd "$OUT" && pwd)"
    SITE="$(mktemp -d "${TMPDIR:-/tmp}/mmsoft-$TAG.XXXXXX")"
    trap 'rm -rf "$SITE"' EXIT
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        timeout "$(remaining)" "$PYTHON" -m pip install --isolated --no-index --no-deps \
            --disable-pip-version-check --no-warn-script-location --target "$SITE" \
            "${WHEELS[@]}" > "$OUT/install.log" 2>&1
    else  # a python without pip: the wheels unpacked as they are
        "$PYTHON" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$SITE" "${WHEELS[@]}" \
            > "$OUT/install.log" 2>&1
    fi || {
        tail -n 20 "$OUT/install.log" >&2
        fail 2 "installing the bundle failed (log: $OUT/install.log)"
    }
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    say "installed ${#WHEELS[@]} wheels into $SITE"
}

# limited SECONDS COMMAND...: COMMAND in the checkout, stopped after SECONDS;
# its exit status, 124 when the time ran out.
limited() {
    local status
    (cd "$ROOT" && timeout --kill-after=5 "$@")
    status=$?
    return $((status == 137 ? 124 : status))
}

# run_check BUNDLE OUT_DIR [--budget-s N] [--allow-cpu] [benchmark options]
run_check() {
    local since left status args=(--tests --device cuda --preset gpu-benchmark)
    start_run check "$@"
    phase install "$INSTALL_SINCE"
    # The benchmark's own budget ends 10 s before the hard limit, so that it
    # writes its results before it could be killed.
    since=$SECONDS
    left=$(($(remaining) - 2))
    [ "$left" -ge 20 ] || fail 124 "the total budget of $BUDGET_S s is spent before the benchmark"
    [ "$DEVICE" = cuda ] || args=(--tests --device cpu --preset smoke)
    args+=(--out-dir "$OUT" --budget-s "$((left - 10))" ${EXTRA[@]+"${EXTRA[@]}"})
    rm -f "$OUT/results.json" "$OUT/results.md"
    say "running tools/analysis/benchmark.py ${args[*]} (hard limit $left s)"
    limited "$left" "$PYTHON" tools/analysis/benchmark.py "${args[@]}" 2>&1 \
        | tee "$OUT/run.log"
    status=${PIPESTATUS[0]}
    [ "$status" = 124 ] && say "stopped by the total budget of $BUDGET_S s: what was measured is kept"
    phase benchmark "$since"
    {
        [ -s "$OUT/results.md" ] || printf '# Benchmark\n\nNo table was written. The end of the log:\n\n```\n%s\n```\n' \
            "$(tail -n 40 "$OUT/run.log")"
        printf '\nOffline run: exit status %s; total %s s of a %s s budget. Phases: %s.\n' \
            "$status" "$(elapsed)" "$BUDGET_S" "$PHASES"
    } >> "$OUT/results.md"
    say "written: $OUT/results.json, $OUT/results.md, $OUT/run.log (total $(elapsed) s)"
    exit "$status"
}

# step NAME COMMAND...: limited to the budget left less 15 s, output into LOG;
# sets STEP_STATUS (124 when the budget stopped it, skipped when none was left)
# and FAILED (1 for a failure, else 124 for a step stopped or left out).
step() {
    local name="$1" left=$(($(remaining) - 15))
    shift
    if [ "$left" -lt 10 ]; then
        say "$name: skipped, the budget is spent"
        STEP_STATUS=skipped
    else
        say "$name: $* (at most $left s)" | tee -a "$LOG"
        limited "$left" "$@" >> "$LOG" 2>&1
        STEP_STATUS=$?
        [ "$STEP_STATUS" = 0 ] && return 0
        say "$name: exit status $STEP_STATUS (log: $LOG)"
        tail -n 15 "$LOG" >&2
    fi
    case "$STEP_STATUS" in
        124|skipped) [ "$FAILED" = 1 ] || FAILED=124 ;;
        *) FAILED=1 ;;
    esac
    return 1
}

# py CODE ARG...: the value that the node's python prints for CODE.
py() { (cd "$ROOT" && "$PYTHON" -c "import json, sys, os; $1" "${@:2}"); }

# run_train BUNDLE OUT_DIR [--budget-s N] [--speed-iters N] [--allow-cpu]
run_train() {
    local since demo label config classes count options table run mmdet
    local demo_config=configs/demo/mask-rcnn_soft-tiny_fpn_demo.py
    local work_root="${WORK_ROOT:-$ROOT/work_dirs/gpu_train}" interval=10
    local amp=(--amp) demo_train=() demo_test=() ops=(--require-cuda)
    start_run train "$@"
    LOG="$OUT/gpu_train.log" FAILED=0
    : > "$LOG"
    mkdir -p "$work_root" && work_root="$(cd "$work_root" && pwd)"
    if [ "$DEVICE" = cpu ]; then  # mmengine's AMP needs a GPU, and so CUDA's ops
        amp=() ops=() interval=1 SPEED_ITERS=2
        demo_train=(--cfg-options train_cfg.max_epochs=1 train_cfg.val_interval=100
                    train_dataloader.dataset.indices=16 default_hooks.logger.interval=1)
        demo_test=(--cfg-options test_dataloader.dataset.indices=8)
    else
        ops+=(--cuda-version "$(py 'print(json.load(open(sys.argv[1]))["mmcv"]["cuda"])' \
            "$BUNDLE/gpu-train-manifest.json")")
    fi
    (cd "$ROOT" && "$PYTHON" tools/gpu_node.py mmcv-ops ${ops[@]+"${ops[@]}"}) 2>&1 \
        | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || fail 1 "mmcv's compiled ops do not run (log: $LOG)"
    phase install "$INSTALL_SINCE"

    # The demo, as make demo runs it.
    since=$SECONDS
    demo="$work_root/demo"
    rm -rf "$demo"
    step data "$PYTHON" tools/generate_demo_data.py coco --seed 0 \
        && step demo-train "$PYTHON" tools/train.py "$demo_config" --work-dir "$demo" \
            ${amp[@]+"${amp[@]}"} ${demo_train[@]+"${demo_train[@]}"} \
        && step demo-test "$PYTHON" tools/test.py "$demo_config" \
            "$(cat "$demo/last_checkpoint")" --work-dir "$demo" \
            ${demo_test[@]+"${demo_test[@]}"} \
        && { [ "$DEVICE" = cpu ] || step demo-check "$PYTHON" \
                 tools/analysis/check_metric.py "$demo" coco/bbox_mAP "$MIN_BBOX_MAP"; }
    table=(--run label=demo "work_dir=$demo" batch=8 size=160x160 "metrics=$demo"
           "status=$STEP_STATUS" "config=$demo_config")
    phase demo "$since"

    # Speed: three configs on the demo data, the same schedule and size.
    since=$SECONDS
    classes=$(py 'categories = json.load(open(sys.argv[1]))["categories"]
print(",".join(c["name"] for c in sorted(categories, key=lambda c: c["id"])))' \
        "$ROOT/data/demo_coco/annotations/instances_train.json" 2>>"$LOG") || {
        say "speed: the demo data has no classes: no speed runs (log: $LOG)"
        FAILED=1
    }
    count=$(tr ',' '\n' <<<"$classes" | wc -l)
    options=(train_dataloader.batch_size=2 train_dataloader.dataset.data_root=data/demo_coco/
             train_dataloader.dataset.ann_file=annotations/instances_train.json
             train_dataloader.dataset.data_prefix.img=train/
             "train_dataloader.dataset.metainfo.classes=($classes)"
             "train_dataloader.dataset.indices=$((2 * SPEED_ITERS))"
             "model.roi_head.bbox_head.num_classes=$count"
             "model.roi_head.mask_head.num_classes=$count" model.backbone.init_cfg=None
             train_cfg.max_epochs=1 val_dataloader=None val_cfg=None val_evaluator=None
             "default_hooks.logger.interval=$interval" default_hooks.checkpoint.interval=1000
             default_hooks.checkpoint.save_last=False)
    [ -z "$classes" ] || mmdet=$(py 'import mmdet
print(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs"))')
    for run in soft++-tiny=configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py \
            ufo-vit-tiny=configs/ufo_vit/mask-rcnn_ufo-vit-tiny_fpn_1x_coco.py \
            "swin-t=${mmdet:-}/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py"; do
        [ -n "$classes" ] || break
        label="${run%%=*}" config="${run#*=}"
        rm -rf "$work_root/speed-$label"
        step "speed-$label" "$PYTHON" tools/train.py "$config" --work-dir \
            "$work_root/speed-$label" ${amp[@]+"${amp[@]}"} --cfg-options "${options[@]}"
        table+=(--run "label=$label" "work_dir=$work_root/speed-$label" batch=2
                size=800x800 "status=$STEP_STATUS" "config=$config")
    done
    phase speed "$since"

    (cd "$ROOT" && "$PYTHON" tools/gpu_node.py table --out "$OUT" --skip 1 \
        --device "$(py 'import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU smoke mode)"
print(f"{name}; torch {torch.__version__}; Python {sys.version.split()[0]}")')" \
        "${table[@]}" \
        --note "Demo: $demo_config${amp[*]:+ (--amp)}, bbox mAP floor $MIN_BBOX_MAP$(
            [ "$DEVICE" = cpu ] && echo ' (not checked in the CPU smoke mode)')." \
        --note "Speed runs: --cfg-options ${options[*]}" \
        --note "Offline run: total $(elapsed) s of a $BUDGET_S s budget. Phases: $PHASES.") \
        || FAILED=1
    say "written: $OUT/gpu_train.md, $OUT/gpu_train.json, $LOG (total $(elapsed) s)"
    exit "$FAILED"
}

case "${3:-}" in -h|--help) usage 0 ;; esac
case "${1:-} ${2:-}" in
    "pack check"|"pack train") LOCK_ONLY=0 pack "$2" "${@:3}" ;;
    "lock check"|"lock train") LOCK_ONLY=1 pack "$2" "${@:3}" ;;
    "run check") run_check "${@:3}" ;;
    "run train") run_train "${@:3}" ;;
    -h*|--help*) usage 0 ;;
    *) usage 2 ;;
esac
