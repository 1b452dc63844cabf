# gpunode.tuning: development entry points. From a fresh clone: `make demo`, `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.collections

# Stages of `make test`, run in this order; each is a target below. Adding a stage is one
# line, e.g. `TEST_STAGES += test-molecule`.
TEST_STAGES := lint unit integration matrix sanity
TEST_STAGES += test-molecule
TEST_STAGES += test-vm

# `make test` runs setup once (with every test stage's apt packages, installed serially before
# any stage starts), then its stages with NO_SETUP=1 so they skip it. A stage run on its own
# (`make test-vm`) sets up for tests first.
SETUP := $(if $(NO_SETUP),,setup)
SETUP_TESTS := $(if $(NO_SETUP),,setup-tests)

.PHONY: help setup setup-tests demo test $(TEST_STAGES) bench clean distclean

help:
	@echo "make setup    install apt packages, .venv, collection symlink (idempotent)"
	@echo "make setup-tests  the same plus every test stage's apt packages"
	@echo "make demo     setup, then run tools/demo.py"
	@echo "make test     setup, then every stage: $(TEST_STAGES)"
	@echo "make lint | unit | integration | matrix | sanity | test-molecule | bench | clean | distclean"

setup:
	@scripts/setup.sh

setup-tests:
	@scripts/setup.sh --tests

demo: $(SETUP)
	@if [[ -f tools/demo.py ]]; then $(PY) tools/demo.py; \
	else echo "demo: tools/demo.py does not exist yet; nothing to run"; fi

# Runs every stage even after a failure, then fails if any stage failed.
test: $(SETUP_TESTS)
	@failed=(); times=(); \
	for stage in $(TEST_STAGES); do \
		echo "=== make $$stage"; start=$$SECONDS; \
		$(MAKE) --no-print-directory NO_SETUP=1 $$stage || failed+=("$$stage"); \
		times+=("$$stage $$((SECONDS - start)) s"); \
	done; \
	echo "=== stage times: $$(IFS=,; echo "$${times[*]}")"; \
	if (( $${#failed[@]} )); then echo "=== FAILED: $${failed[*]}"; exit 1; fi; \
	echo "=== all stages passed: $(TEST_STAGES)"

lint: $(SETUP_TESTS)
	@scripts/lint.sh

# pytest exits 5 when it collects no tests: not a failure while the suite is being written. Two
# pytest-xdist workers (2 cores): every test builds its nodes under its own tmp_path.
UNIT_WORKERS ?= 2
unit: $(SETUP_TESTS)
	@if [[ ! -d tests/unit ]]; then echo "unit: no tests/unit directory"; exit 0; fi; \
	rc=0; $(PY) -m pytest -q --durations=10 -n $(UNIT_WORKERS) tests/unit || rc=$$?; \
	if (( rc == 5 )); then echo "unit: no tests collected"; rc=0; fi; \
	exit $$rc

# The playbooks end to end against simulated nodes (ansible-playbook subprocesses), in two
# pytest-xdist workers: each test builds its own nodes under its own tmp_path.
INTEGRATION_WORKERS ?= 2
integration: $(SETUP_TESTS)
	@$(PY) -m pytest -q --durations=20 -p no:cacheprovider -n $(INTEGRATION_WORKERS) tests/integration

# The tests whose behaviour differs by ansible-core version (scripts/matrix.py MATRIX_UNIT and
# MATRIX_TESTS) on every supported one, each in its own environment under .cache/matrix (created on
# first use from requirements/matrix-*.txt with a Python that version supports, then cached; no apt
# package), all versions at once. One version: make matrix MATRIX_VERSIONS=2.16
matrix: $(SETUP_TESTS)
	@$(PY) scripts/matrix.py test $(MATRIX_VERSIONS)

# ansible-test sanity with the oldest and the newest supported ansible-core, each from its matrix
# environment (each ansible-core brings its own ansible-test; the newest needs Python 3.12+, and a
# machine without one fails here saying what to install). One: make sanity SANITY_VERSIONS=2.21
SANITY_VERSIONS ?= $(shell $(PY) scripts/matrix.py versions | sed -n '1p;$$p')
sanity: $(SETUP_TESTS)
	@versions="$(SANITY_VERSIONS)"; [[ -n $$versions ]] || { echo "sanity: no matrix versions" >&2; exit 1; }; \
	rc=0; for version in $$versions; do \
		echo "=== sanity with ansible-core $$version"; \
		if bin=$$($(PY) scripts/matrix.py bin "$$version"); then \
			GPUNODE_ANSIBLE_BIN=$$bin scripts/sanity.sh $(SANITY_ARGS) || rc=$$?; \
		else rc=1; fi; \
	done; \
	exit $$rc

# Molecule scenarios in podman, both Debian releases; images are built once and cached
# (docs/dev/molecule.md). One scenario: make test-molecule MOLECULE_SCENARIOS=default
test-molecule: $(SETUP_TESTS)
	@scripts/molecule.sh $(MOLECULE_SCENARIOS)

# The playbooks against a real Linux kernel in a QEMU guest, Debian's QEMU and a build with a
# writable MRRS field (docs/dev/vm.md); skipped where QEMU cannot be installed. Builds are cached
# under /var/cache/gpunode-tuning/vm. One variant: make test-vm VM_VARIANTS=patched
test-vm: $(SETUP_TESTS)
	@tests/vm/run.sh $(VM_VARIANTS)

bench: $(SETUP)
	@if [[ -f benchmarks/bench_modules.py ]]; then $(PY) benchmarks/bench_modules.py; \
	else echo "bench: benchmarks/bench_modules.py does not exist yet"; fi
	@$(PY) benchmarks/bench_fleet.py $(BENCH_FLEET_ARGS)

clean:
	rm -rf reports tests/output .pytest_cache .ruff_cache
	find . -path ./.venv -prune -o -path ./.collections -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Also removes the virtual environment; the next `make setup` rebuilds it.
distclean: clean
	rm -rf $(VENV) .collections
