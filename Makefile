# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create .venv/ when missing and install the pinned stack
# (requirements/*.txt) and mmsoft in editable mode; a second run only checks.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.mmsoft-installed
PYTEST_ARGS ?=

.PHONY: install demo test clean-venv

$(STAMP): requirements/build.txt requirements/mmcv.txt requirements/runtime.txt \
		requirements/tests.txt requirements/deploy.txt requirements/mim.txt \
		setup.cfg tools/install_env.sh
	bash tools/install_env.sh $(VENV)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PYTHON="$(abspath $(PYTHON))" bash tools/demo.sh

test: $(STAMP)
	$(PYTHON) -m pytest tests $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
