# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create .venv/ when missing and install the locked stack
# (requirements/locks/, written from requirements/*.txt by `make lock`) and
# mmsoft in editable mode; a second run only checks.
#
# `make test` runs the suite in three environments, each test where it
# tells something (docs/testing.md):
# - test-newest, .venv-newest/ (tools/install.sh newest): CPython 3.12,
#   the newest torch, torchvision, timm, transformers 5.x and
#   segmentation-models-pytorch, no OpenMMLab: every test not marked
#   `openmmlab`, the ceiling of the supported torch range;
# - test-floor, .venv-floor/ (tools/install.sh floor): torch 2.1.2,
#   mmcv-lite, no torchvision: every test not marked `mmcv_ops`,
#   `torchvision` or `frameworks`, the floor of the range;
# - test-stack, .venv/ (the OpenMMLab stack: torch 2.14.1, mmcv with its
#   compiled ops, mmpretrain, transformers 4.51): what the other two cannot
#   run, the tests marked `mmcv_ops`, `openmmlab` and `torchvision`
#   (mmpretrain) or `stack` (a release only the stack has: tests/conftest.py's
#   STACK_RELEASES); the peers' own tests (tests/vendor/) are the newest's.
# The stack's install (mmcv's compile, minutes) and suite run in the
# background while the other two environments install and their suites run.
# Every suite runs even when another failed; the status is a failure if any
# failed.
# PYTEST_ARGS is passed to all three (a `-m` in it replaces the marker
# expressions: use STACK_MARKERS, FLOOR_MARKERS, NEWEST_MARKERS).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.mmsoft-installed
FLOOR_VENV ?= .venv-floor
FLOOR_PYTHON := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.mmsoft-installed
NEWEST_VENV ?= .venv-newest
NEWEST_PYTHON := $(NEWEST_VENV)/bin/python
NEWEST_STAMP := $(NEWEST_VENV)/.mmsoft-installed
STACK_MARKERS ?= mmcv_ops or (openmmlab and torchvision) or stack
FLOOR_MARKERS ?= not mmcv_ops and not torchvision and not frameworks and not scripts
NEWEST_MARKERS ?= not openmmlab
# Where `make test` writes the output of the stack's install and suite, and
# of the floor's install, while they run in the background (printed when
# they are done).
STACK_LOG ?= install-logs/make-test-stack.log
FLOOR_LOG ?= install-logs/make-test-floor.log
# When each install and suite of `make test` started and ended.
TIMELINE ?= install-logs/make-test-timeline.txt
PYTEST_ARGS ?= --durations=15
FLOOR_PYTEST = $(FLOOR_PYTHON) -m pytest tests -m "$(FLOOR_MARKERS)" $(PYTEST_ARGS)
# `make test` runs the floor's suite as FLOOR_SHARDS processes (pytest's
# --shard K/N, tests/conftest.py), below the newest suite's priority: beside
# it they share what it leaves of the cores, and once it is done they keep
# both busy, not one.
FLOOR_SHARDS ?= 2
# The torch threads of each suite in `make test` (OMP_NUM_THREADS): one, as
# two suites run side by side on two cores.
SUITE_THREADS ?= 1
SUITE_ENV := OMP_NUM_THREADS=$(SUITE_THREADS) MKL_NUM_THREADS=$(SUITE_THREADS)
# The environments are installed without bytecode (most of their modules
# are never imported): in these targets Python writes the bytecode of what it
# imports, once, even where the shell sets PYTHONDONTWRITEBYTECODE
# (docs/testing.md).
install install-floor install-newest demo lint test test-stack test-floor \
		test-newest: export PYTHONDONTWRITEBYTECODE :=
# `make gpu-check` installs nothing: it runs in the active environment's
# python, which needs torch (a CUDA build), timm for the peers and pytest;
# no OpenMMLab package. GPU_CHECK_PYTHON=... picks another. It runs the CUDA
# tests, then a short benchmark (tools/analysis/benchmark.py; docs/gpu.md);
# GPU_CHECK_ARGS adds options.
GPU_CHECK_PYTHON ?= python
GPU_CHECK_ARGS ?=
GPU_CHECK := --device cuda --tests --preset gpu-check
# `make gpu-benchmark` runs the GPU benchmark of docs/cost.md ("On a GPU"):
# the CUDA tests, then batch 2, float32 and AMP, eager then compiled, with
# kernels per step and GPU-busy share; GPU_BENCHMARK_ARGS adds options.
GPU_BENCHMARK_ARGS ?=
GPU_BENCHMARK := --device cuda --tests --preset gpu-benchmark
# `make gpu-bundle` writes the offline bundle for a GPU node without
# internet (tools/gpu_node.sh pack check; docs/gpu.md): pytest's wheels,
# mmsoft's wheel, their lock and SHA256SUMS. `make gpu-bundle-lock` rewrites
# the lock (requirements/locks/gpu-bundle.txt, CPython 3.12, manylinux x86-64).
GPU_BUNDLE ?= work_dirs/gpu_bundle
GPU_BUNDLE_ARGS ?=
# `make gpu-train-bundle` writes the offline OpenMMLab bundle for training on
# a GPU node (tools/gpu_node.sh pack train; docs/gpu.md): the wheels of
# mmengine, mmdet, mmsegmentation and pycocotools, and mmcv compiled with its
# CUDA ops against torch 2.11 (CUDA 13.0), once (hours on 2 cores; then from
# $MMSOFT_WHEEL_CACHE). `make test` does not run it. `make
# gpu-train-bundle-lock` rewrites its locks (requirements/locks/gpu-train*.txt).
GPU_TRAIN_BUNDLE ?= work_dirs/gpu_train_bundle

.PHONY: install install-floor install-newest lock demo lint test test-stack test-floor \
	test-newest gpu-check gpu-benchmark gpu-bundle gpu-bundle-lock clean-venv

$(STAMP): requirements/locks/stack.txt requirements/locks/mmcv.txt setup.cfg \
		tools/install.sh tools/build_mmcv_wheel.sh
	bash tools/install.sh stack $(VENV)
	touch $(STAMP)

$(FLOOR_STAMP): requirements/locks/floor.txt requirements/locks/floor-nodeps.txt setup.cfg \
		tools/install.sh
	bash tools/install.sh floor $(FLOOR_VENV)
	touch $(FLOOR_STAMP)

$(NEWEST_STAMP): requirements/locks/newest.txt setup.cfg tools/install.sh
	bash tools/install.sh newest $(NEWEST_VENV)
	touch $(NEWEST_STAMP)

install: $(STAMP)

install-floor: $(FLOOR_STAMP)

install-newest: $(NEWEST_STAMP)

# Rewrites requirements/locks/ from requirements/*.txt (tools/install.sh lock).
lock:
	bash tools/install.sh lock

demo: $(STAMP)
	PYTHON="$(abspath $(PYTHON))" bash tools/demo.sh

# flake8 with setup.cfg's rules on the package, the tools and the tests, in the
# newest environment (seconds); `make test` runs it once that environment is
# installed, before its suite.
lint: $(NEWEST_STAMP)
	$(NEWEST_PYTHON) -m flake8 mmsoft tools tests

# The stack's install (mmcv's compile) and then its suite run in the
# background (their output in $(STACK_LOG), printed at the end), at normal
# priority: they are the longest path. Meanwhile the newest environment
# installs, the lint runs (`make lint`, seconds: a failure fails `make test`
# and the suites still run), then the newest suite runs at a lower priority
# (nice), on what the
# compile leaves of the cores, while the floor environment installs; the
# floor's suite, as FLOOR_SHARDS processes at a lower priority still, starts
# when the stack's or the newest suite is done (its output in $(FLOOR_LOG),
# printed after the newest suite's). Each suite's torch runs SUITE_THREADS
# threads: two suites share the two cores from the compile's end, and the
# floor's shards keep both busy when the other suites are done
# (docs/testing.md). The newest and floor
# installs take turns, not side by side; each install unpacks a file once,
# into its environment (uv's cache there, hard-linked, tools/install.sh):
# together with the stack, the disk holds the three environments.
# Before anything starts, the disk is checked for all three and the suites.
# Last, the timeline: when each install and suite started and ended, in
# seconds from the start ($(TIMELINE)).
test:
	@bash tools/install.sh check-disks test $(VENV):stack $(FLOOR_VENV):floor \
		$(NEWEST_VENV):newest .:suites || exit 1; \
	status=0; mkdir -p $(dir $(STACK_LOG)) $(dir $(FLOOR_LOG)) $(dir $(TIMELINE)); \
	start=$$(date +%s); : > $(TIMELINE); \
	mark() { echo "$$(( $$(date +%s) - start )) $$1" >> $(TIMELINE); }; \
	echo "[test] the stack: install and suite in the background (log: $(STACK_LOG))"; \
	{ mark 'stack: install starts'; $(MAKE) --no-print-directory install \
		&& { mark 'stack: suite starts'; $(SUITE_ENV) $(MAKE) --no-print-directory test-stack; }; \
		rc=$$?; mark 'stack: ends'; exit $$rc; } > $(STACK_LOG) 2>&1 & stack=$$!; \
	mark 'newest: install starts'; \
	$(MAKE) --no-print-directory install-newest && newest=1 || { newest=0; status=1; }; \
	if [ $$newest = 1 ]; then mark 'lint starts'; \
		$(MAKE) --no-print-directory lint || status=1; mark 'lint ends'; fi; \
	echo "[test] the floor: install and suite in the background (log: $(FLOOR_LOG))"; \
	{ mark 'floor: install starts'; $(MAKE) --no-print-directory install-floor; \
		rc=$$?; mark 'floor: install ends'; \
		if [ $$rc = 0 ]; then \
			until grep -q -e 'stack: ends' -e 'newest: ends' $(TIMELINE); do sleep 5; done; \
			mark 'floor: suite starts'; shards=""; \
			for part in $$(seq $(FLOOR_SHARDS)); do \
				$(SUITE_ENV) nice -n 15 $(FLOOR_PYTEST) --shard $$part/$(FLOOR_SHARDS) \
					> $(FLOOR_LOG).$$part 2>&1 & shards="$$shards $$!"; \
			done; \
			for shard in $$shards; do wait $$shard || rc=1; done; \
			for part in $$(seq $(FLOOR_SHARDS)); do cat $(FLOOR_LOG).$$part; done; \
			mark 'floor: suite ends'; fi; \
		exit $$rc; } > $(FLOOR_LOG) 2>&1 & floor=$$!; \
	if [ $$newest = 1 ]; then mark 'newest: suite starts'; \
		$(SUITE_ENV) nice -n 10 $(MAKE) --no-print-directory test-newest || status=1; \
	fi; mark 'newest: ends'; \
	wait $$floor || status=1; \
	echo "[test] the floor's install and suite:"; cat $(FLOOR_LOG); \
	wait $$stack || status=1; \
	echo "[test] the stack's install and suite:"; cat $(STACK_LOG); \
	mark 'all: end'; echo "[test] the timeline, in seconds from the start:"; \
	sort -s -n -k1,1 $(TIMELINE) | sed 's/^/[test]   /'; \
	exit $$status

# The peers' own tests (tests/vendor/) run in the newest environment, whose
# releases they come from (the stack's timm is the same, its transformers
# 4.51): not here.
test-stack: $(STAMP)
	$(PYTHON) -m pytest tests --ignore=tests/vendor -m "$(STACK_MARKERS)" $(PYTEST_ARGS)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_PYTEST)

test-newest: $(NEWEST_STAMP)
	$(NEWEST_PYTHON) -m pytest tests -m "$(NEWEST_MARKERS)" $(PYTEST_ARGS)

gpu-check:
	$(GPU_CHECK_PYTHON) tools/analysis/benchmark.py $(GPU_CHECK) \
		--out-dir work_dirs/gpu_check $(GPU_CHECK_ARGS)

gpu-benchmark:
	$(GPU_CHECK_PYTHON) tools/analysis/benchmark.py $(GPU_BENCHMARK) \
		--out-dir work_dirs/gpu_benchmark $(GPU_BENCHMARK_ARGS)

gpu-bundle:
	bash tools/gpu_node.sh pack check $(GPU_BUNDLE) $(GPU_BUNDLE_ARGS)

gpu-bundle-lock:
	bash tools/gpu_node.sh lock check

.PHONY: gpu-train-bundle gpu-train-bundle-lock

gpu-train-bundle:
	bash tools/gpu_node.sh pack train $(GPU_TRAIN_BUNDLE)

gpu-train-bundle-lock:
	bash tools/gpu_node.sh lock train

clean-venv:
	rm -rf $(VENV) $(FLOOR_VENV) $(NEWEST_VENV) .venv-lock
