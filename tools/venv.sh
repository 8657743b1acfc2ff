# Sourced by tools/install_env.sh and tools/install_floor_env.sh.
#
# ensure_venv DIR TAG: creates the virtual environment DIR (with pip<26)
# when it has no python yet; TAG prefixes the log line.
ensure_venv() {
    local venv="$1" tag="$2"
    if [ ! -x "$venv/bin/python" ]; then
        echo "[$tag] creating virtual environment $venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --upgrade "pip<26"
    fi
}
