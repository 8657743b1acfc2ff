# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create .venv/ when missing and install the locked stack
# (requirements/locks/, written from requirements/*.txt by `make lock`) and
# mmsoft in editable mode; a second run only checks.
#
# `make test` tests both ends of the supported torch range: the full suite in
# .venv/ (test-stack: torch 2.14.1 and torchvision, mmcv with its compiled
# ops), then the suite without the tests marked `mmcv_ops` or `torchvision`
# in .venv-floor/ (test-floor: torch 2.1, mmcv-lite, no torchvision;
# tools/install_floor_env.sh, requirements/locks/floor*.txt). Both run
# even when the first fails; the status is a failure if either failed.
# PYTEST_ARGS is passed to both (a `-m` in it replaces the floor's marker
# expression: use FLOOR_MARKERS for the floor run).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.mmsoft-installed
FLOOR_VENV ?= .venv-floor
FLOOR_PYTHON := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.mmsoft-installed
FLOOR_MARKERS ?= not mmcv_ops and not torchvision
PYTEST_ARGS ?= --durations=15
# `make gpu-check` installs nothing: it runs in the active environment's
# python, which needs torch (a CUDA build), timm for the peers and pytest;
# no OpenMMLab package. GPU_CHECK_PYTHON=... picks another.
GPU_CHECK_PYTHON ?= python
GPU_CHECK_ARGS ?=
# `make gpu-bundle` writes the offline bundle for a GPU node without
# internet (tools/gpu_bundle.sh; docs/gpu.md): pytest's wheels, mmsoft's
# wheel, their lock and SHA256SUMS. `make gpu-bundle-lock` rewrites the lock
# (requirements/locks/gpu-bundle.txt, CPython 3.12, manylinux x86-64).
GPU_BUNDLE ?= work_dirs/gpu_bundle
GPU_BUNDLE_ARGS ?=

.PHONY: install install-floor lock demo test test-stack test-floor gpu-check gpu-bundle \
	gpu-bundle-lock clean-venv

$(STAMP): requirements/locks/stack.txt requirements/locks/mmcv.txt setup.cfg \
		tools/install_env.sh tools/build_mmcv_wheel.sh tools/install_common.sh
	bash tools/install_env.sh $(VENV)
	touch $(STAMP)

$(FLOOR_STAMP): requirements/locks/floor.txt requirements/locks/floor-nodeps.txt setup.cfg \
		tools/install_floor_env.sh tools/install_common.sh
	bash tools/install_floor_env.sh $(FLOOR_VENV)
	touch $(FLOOR_STAMP)

install: $(STAMP)

install-floor: $(FLOOR_STAMP)

# Rewrites requirements/locks/ from requirements/*.txt (tools/lock.sh).
lock:
	bash tools/lock.sh

demo: $(STAMP)
	PYTHON="$(abspath $(PYTHON))" bash tools/demo.sh

# Both environments install side by side (the floor's download overlaps the
# stack's; a failed install stops here), then the suites run one after the
# other.
test:
	@status=0; \
	$(MAKE) --no-print-directory -j2 install install-floor || exit 1; \
	$(MAKE) --no-print-directory test-stack || status=1; \
	$(MAKE) --no-print-directory test-floor || status=1; \
	exit $$status

test-stack: $(STAMP)
	$(PYTHON) -m pytest tests $(PYTEST_ARGS)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_PYTHON) -m pytest tests -m "$(FLOOR_MARKERS)" $(PYTEST_ARGS)

gpu-check:
	$(GPU_CHECK_PYTHON) tools/analysis/gpu_check.py --out work_dirs/gpu_check/gpu_check.json $(GPU_CHECK_ARGS)

gpu-bundle:
	bash tools/gpu_bundle.sh $(GPU_BUNDLE) $(GPU_BUNDLE_ARGS)

gpu-bundle-lock:
	bash tools/gpu_bundle.sh lock

clean-venv:
	rm -rf $(VENV) $(FLOOR_VENV) .venv-lock
