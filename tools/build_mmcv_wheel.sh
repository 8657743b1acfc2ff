#!/usr/bin/env bash
# Builds mmcv's wheel, with its compiled ops, against the torch of a Python
# environment, from the sdist pinned (with its hash) in
# requirements/locks/mmcv.txt; its steps: docs/get_started.md, their times
# and what each saves: docs/testing.md.
#
#   bash tools/build_mmcv_wheel.sh key PYTHON
#       the wheel cache's key: the lock, PYTHON's torch, this script, the
#       compiler and the build settings below; a change to any rebuilds.
#   bash tools/build_mmcv_wheel.sh prepare PYTHON
#       every step before the compile (seconds; each install runs it).
#   bash tools/build_mmcv_wheel.sh build PYTHON WHEEL_DIR
#       prepare, then compile the wheel into WHEEL_DIR.
#
# No step builds in isolation (setuptools 82+ lacks the pkg_resources that
# mmcv's setup.py imports): the environment's pinned setuptools builds, and
# the ops link its torch. From torch 2.14 on, C++17 is raised to C++20;
# CFLAGS defaults to Python's own and -g0. Without CUDA, torch's headers are
# precompiled (precompiling_cxx) and only MMCV_OPS compile (only_ops).
#
# Environment: MAX_JOBS (compile jobs, default: the number of cores); CC, CXX,
# CFLAGS, CXXFLAGS, LDFLAGS, TORCH_CUDA_ARCH_LIST, FORCE_CUDA, CUDA_HOME and
# MMCV_OPS (the ops a build without CUDA compiles, by their units' names;
# default: nms roi_align; `all`) pass to the build and are part of the key.
set -euo pipefail
SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SCRIPT")/.."
# shellcheck source=tools/install.sh
source tools/install.sh
TAG=build-mmcv
LOCK=requirements/locks/mmcv.txt
BUILD_SETTINGS=(CC CXX CFLAGS CXXFLAGS LDFLAGS TORCH_CUDA_ARCH_LIST FORCE_CUDA CUDA_HOME
                MMCV_OPS)
DEFAULT_OPS='nms roi_align'

usage() {
    echo "usage: bash tools/build_mmcv_wheel.sh {key PYTHON | prepare PYTHON | build PYTHON WHEEL_DIR}" >&2
    exit 2
}

# cache_key PYTHON: "mmcv-<version>-torch-<version>-<digest>".
cache_key() {
    local py="$1" version torch_info settings="" name
    version=$(sed -n 's/^mmcv==\([^ ]*\).*/\1/p' "$LOCK")
    torch_info=$("$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())")
    for name in "${BUILD_SETTINGS[@]}"; do settings+="$name=${!name:-};"; done
    local digest
    digest=$({
        cat "$LOCK"
        echo "$torch_info"
        sha256sum < "$SCRIPT"
        "${CXX:-c++}" --version 2>&1 | head -n 1
        echo "$settings"
    } | sha256sum | cut -c1-16)
    echo "mmcv-$version-torch-${torch_info%% *}-$digest"
}

# prepare PYTHON SRC: the patched source tree of mmcv under SRC; prints its
# folder.
prepare() {
    local py="$1" src="$2"
    run_step "$TAG" "downloading the mmcv sdist and reading its metadata ($LOCK, no pip cache)" mmcv \
        env PIP_NO_CACHE_DIR=1 "$py" -m pip download --disable-pip-version-check \
        --no-deps --no-build-isolation --no-binary :all: --require-hashes \
        -d "$src" -r "$LOCK" >&2
    tar -xzf "$src"/mmcv-*.tar.gz -C "$src"
    local setup
    setup=$(ls "$src"/mmcv-*/setup.py)
    if "$py" -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 14))"; then
        echo "[$TAG] torch $("$py" -c 'import torch; print(torch.__version__)') needs C++20: building the ops as C++20" >&2
        sed -i "s/'-std=c++17'/'-std=c++20'/g" "$setup"
        grep -q "'-std=c++20'" "$setup" || {
            echo "[$TAG] $setup sets no -std=c++17 to raise" >&2; exit 1; }
    fi
    dirname "$setup"
}

# precompiling_cxx DIR: writes DIR/c++, the compiler of the build: ${CXX:-c++}
# run as asked, after precompiling pytorch_cpp_helper.hpp (found on the
# unit's -I paths) into pytorch_cpp_helper.hpp.gch with the unit's flags
# (its -MMD, -MF, -c, -o and source left out), once, under a lock. Where that
# fails, the units compile without it.
precompiling_cxx() {
    { echo '#!/usr/bin/env bash'; echo "real='${CXX:-c++}'"; cat <<'SH'; } > "$1/c++"
flags=() command=("$real" "$@") header=""
while [ $# -gt 0 ]; do
    case "$1" in
        -MMD|-c|*.cpp|*.cc) ;;
        -MF|-o) shift ;;
        -I*) [ -f "${1#-I}/pytorch_cpp_helper.hpp" ] \
                 && header="${1#-I}/pytorch_cpp_helper.hpp"; flags+=("$1") ;;
        *) flags+=("$1") ;;
    esac
    shift
done
if [ -n "$header" ] && [ ! -e "$header.gch" ]; then
    (flock 9; [ -e "$header.gch" ] || { "$real" "${flags[@]}" -x c++-header "$header" \
        -o "$header.gch.part" && mv "$header.gch.part" "$header.gch"; }) 9> "$header.lock"
fi
exec "${command[@]}"
SH
    chmod +x "$1/c++"
}

# only_ops PY CSRC OPS...: the units of mmcv's CPU ops in CSRC (its
# csrc/pytorch folder, and cpu/ in it) but those of OPS and info.cpp removed.
# pybind.cpp binds each function of a removed unit to one that raises,
# naming the op and MMCV_OPS, so that every mmcv module still imports.
only_ops() {
    local py="$1"
    shift
    "$py" - "$@" <<'PY'
import glob, json, os, re, sys
csrc, ops = sys.argv[1], sys.argv[2:]
kept = ''
for path in glob.glob(f'{csrc}/*.cpp') + glob.glob(f'{csrc}/cpu/*.cpp'):
    name = os.path.basename(path)[:-len('.cpp')]
    if name in ops or name.removesuffix('_cpu') in ops or name == 'info':
        kept += open(path).read() if os.path.dirname(path) == csrc else ''
    elif name != 'pybind':
        os.remove(path)
start = 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n'
head, body = open(f'{csrc}/pybind.cpp').read().split(start)
binds = list(re.finditer(r'  m\.def\("(\w+)",\s*&(\w+).*?\);\n', body, re.S))
if ''.join(bind.group(0) for bind in binds) + '}\n' != body:
    sys.exit(f'{csrc}/pybind.cpp: its module holds more than m.def calls')
tail = (f' is not compiled: this build of mmcv compiled {" ".join(ops)} (MMCV_OPS '
        "of mmsoft's tools/build_mmcv_wheel.sh; all: every op)")
lines = [head, 'struct LeftOut {\n  std::string name;\n',
         '  py::object operator()(py::args, py::kwargs) const {\n',
         f'    throw std::runtime_error("mmcv\'s op " + name + {json.dumps(tail)});\n',
         '  }\n};\n\n', start]
for bind in binds:
    name, function = bind.groups()
    defined = re.search(rf'\b{function}\([^;{{]*\)\s*{{', kept)
    lines.append(bind.group(0) if defined else f'  m.def("{name}", LeftOut{{"{name}"}});\n')
open(f'{csrc}/pybind.cpp', 'w').write(''.join(lines) + '}\n')
PY
}

# Sourced (a test of precompiling_cxx), it defines its functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
[ $# -ge 2 ] || usage
MODE="$1"
PY="$2"
# setuptools replaces its CFLAGS with the environment's: hence the whole line.
[ -n "${CFLAGS+set}" ] || CFLAGS="$("$PY" -c \
    'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")') -g0"
export CFLAGS
case "$MODE $#" in
    "key "*)
        cache_key "$PY" ;;
    "prepare 2"|"build 3")
        SRC=$(mktemp -d)
        trap 'rm -rf "$SRC"' EXIT
        TREE=$(prepare "$PY" "$SRC")
        if [ "$MODE" = prepare ]; then
            echo "[$TAG] ready to compile (prepare only: nothing built)"
            exit 0
        fi
        WHEEL_DIR="$3"
        mkdir -p "$WHEEL_DIR"
        COMPILER=()
        if [ "${FORCE_CUDA:-0}" != 1 ]; then
            precompiling_cxx "$SRC"
            COMPILER=(CXX="$SRC/c++")
            OPS="${MMCV_OPS:-$DEFAULT_OPS}"
            if [ "$OPS" != all ] \
                && "$PY" -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
                echo "[$TAG] compiling mmcv's CPU ops $OPS (MMCV_OPS)" >&2
                # shellcheck disable=SC2086 # the ops, one word each
                only_ops "$PY" "$TREE/mmcv/ops/csrc/pytorch" $OPS
            fi
        fi
        run_step "$TAG" "compiling mmcv with its ops (MAX_JOBS=${MAX_JOBS:-$(nproc)}; the longest step of an install, docs/testing.md)" mmcv \
            env MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" ${COMPILER[@]+"${COMPILER[@]}"} \
            "$PY" -m pip wheel --disable-pip-version-check --no-build-isolation \
            --no-deps --no-cache-dir -w "$WHEEL_DIR" "$TREE" ;;
    *)
        usage ;;
esac
