# The Python interpreter of the shell launchers (tools/*.sh), which source
# this file. It sets PYTHON to, in this order:
#   1. $PYTHON, when set (e.g. PYTHON=python to use the active environment);
#   2. the checkout's .venv/bin/python (what `make install`, `make demo` and
#      `make test` create), when it exists;
#   3. python from PATH.
# Symbolic links to the tools/ folder are followed to find the checkout.
if [ -z "${PYTHON:-}" ]; then
    _mmsoft_root="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [ -x "$_mmsoft_root/.venv/bin/python" ]; then
        PYTHON="$_mmsoft_root/.venv/bin/python"
    else
        PYTHON=python
    fi
    unset _mmsoft_root
fi
