# Sourced by tools/install_env.sh and tools/install_floor_env.sh.
#
# ensure_venv DIR TAG: creates the virtual environment DIR when it has no
# python yet, with pip<26; TAG prefixes the log line.
ensure_venv() {
    local venv="$1" tag="$2"
    if [ ! -x "$venv/bin/python" ]; then
        echo "[$tag] creating virtual environment $venv"
        python3 -m venv "$venv"
    fi
    # Also after an interrupted first run: pip 23 (Python 3.11's) would make
    # the editable install a legacy one.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --upgrade "pip<26"
}

# link_package_for_mim DIR: makes OpenMMLab's mim find the editable mmsoft of
# the virtual environment DIR. mim (0.3.9) reads a package's configs, tools
# and model index from <location>/mmsoft/.mim, where <location> is the folder
# of the installed metadata: site-packages. An editable install (PEP 660)
# leaves the package in the checkout, so site-packages/mmsoft becomes a link
# to it: imports then resolve through the link to the same files. The link is
# listed in the install's RECORD, so `pip uninstall mmsoft` removes it.
link_package_for_mim() {
    local venv="$1" site record
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    if [ -e "$site/mmsoft" ] && [ ! -L "$site/mmsoft" ]; then
        echo "[mim] $site/mmsoft is not a link (a regular install?): left as it is" >&2
        return 0
    fi
    ln -sfn "$(pwd)/mmsoft" "$site/mmsoft"
    record=$(ls "$site"/mmsoft-*.dist-info/RECORD)
    grep -qx 'mmsoft,,' "$record" || echo 'mmsoft,,' >> "$record"
}
