# The Python interpreter of the shell launchers (tools/*.sh), which source
# this file. It sets PYTHON to, in this order:
#   1. $PYTHON, when set (e.g. PYTHON=python to use the active environment);
#   2. the checkout's .venv/bin/python (what `make install`, `make demo` and
#      `make test` create), when it exists;
#   3. python from PATH.
# Symbolic links to the tools/ folder are followed to find the checkout.
if [ -z "${PYTHON:-}" ]; then
    PYTHON="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
    [ -x "$PYTHON" ] || PYTHON=python
fi
