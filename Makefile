# llamacpp-mla-port: every target calls the CLI; the first one creates .venv/.
# Main job:  make patch build      Tests:  make test
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TOOL   := $(BIN)/llamacpp-mla-port
STAMP  := $(VENV)/.installed

# Pass-through knobs (see README):
#   PATCH_ARGS="--source sdist"  or  PATCH_ARGS="--git-url ~/src/llama.cpp"
#   BUILD_ARGS="--cmake-arg=-DGGML_CUDA=ON"
#   RPC=0          make build without llama.cpp's RPC backend (on by default: one configuration for all)
#   PYTEST_ARGS="tests/series -x"   (make test / test-fast / test-slow)
#   CANARY_ONTO=newest|bNNNNN|NAME==VERSION|COMMIT|PATH  CANARY_ARGS="--git-url ~/src/llama.cpp"
#   CANARY_DIR=DIR (make canary; default: work-canary, or $MLA_PORT_CANARY_DIR)
#   PARITY_BUILD=work/build-portable   (make parity: the build to run the parity matrix on;
#                  default: the work build, or $MLA_PORT_BUILD)
# Places left unset here are the tool's to decide (project.Places: flag > env > the checkout).
#   BENCH_ARGS="--threads 4 --stages models,floors,passes"
#   DRY_RUN=1      make device-check: run the GPU check's bundle here with CUDA off
#   HARNESS_ARGS="--stack cpu-fa-kv-head-tiles --isa native,avx2"   (make harness-diff)
#   UPSTREAM_BENCH_ARGS="--stack cpu-q0-odd-columns -t 2 -r 2"   (make upstream-bench)
PATCH_ARGS ?=
BUILD_ARGS ?=
RPC ?=
PYTEST_ARGS ?=
CANARY_ONTO ?= newest
CANARY_DIR ?=
CANARY_ARGS ?=
PARITY_BUILD ?=
BENCH_ARGS ?=
DRY_RUN ?=
HARNESS_ARGS ?=
UPSTREAM_BENCH_ARGS ?=

.PHONY: help venv patch check build smoke parity test test-fast test-slow pr canary bench bench-rpc bench-auto device-check harness-diff upstream-bench clean-work clean

help:
	@echo "make venv        the project-local .venv/ alone (the targets that run the tool make it first)"
	@echo "make patch       pinned llama.cpp + the series applied in ./work/llama.cpp; patches/ exported"
	@echo "make build       CMake build of the patched tree in ./work/build, with the RPC backend (the one build the tests reuse)"
	@echo "make check       fail when patches/ drift from a fresh render of templates/"
	@echo "make smoke       build, make fixtures, parity + lossless proof, one JSON report"
	@echo "make parity      the logit-parity matrix and threshold table on PARITY_BUILD (default work/build)"
	@echo "make test        the test suite (drift check, engine, runtime, converter, proof, doctor)"
	@echo "make test-fast   the tests that need no llama.cpp (no build, no tree): the daily loop, under a minute"
	@echo "make test-slow   real-size checks: real-config conversion, the real-size pair lossless (~20 GB disk)"
	@echo "make pr          upstream kit: one folder per PR stack in work/pr/ (patches, evidence with upstream tables, checklist)"
	@echo "make canary      render, apply, build and prove the series on the newest known upstream (./work-canary)"
	@echo "make bench       real-size draft vs measured floors, PyTorch, KV, what it buys Kimi-K3: work/bench/report.md"
	@echo "make bench-rpc   local vs RPC (two loopback ggml-rpc-servers) timings, side by side"
	@echo "make bench-auto  --spec-draft-auto vs the target alone and every draft length, Kimi-K3-shaped pair (~10 GB disk)"
	@echo "make device-check  the GPU check: offline bundle for a device machine (DRY_RUN=1: run it here, CUDA off)"
	@echo "make harness-diff  upstream's tests (test-llama-archs, test-backend-ops) on the base and patched, same flags"
	@echo "make upstream-bench  llama-bench / test-backend-ops perf, base against each CPU stack: compare-llama-bench tables"
	@echo "make clean-work  delete the tool-owned work dirs ./work and ./work-canary"
	@echo "make clean       clean-work, and delete .venv/ and the pytest and hypothesis caches"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,torch,bench]'
	@touch $@

venv: $(STAMP)

patch: $(STAMP)
	$(TOOL) patch $(PATCH_ARGS)

check: $(STAMP)
	$(TOOL) check $(PATCH_ARGS)

build: patch
	$(TOOL) build $(if $(filter 0,$(RPC)),--no-rpc) $(BUILD_ARGS)

smoke: build
	$(TOOL) smoke

parity: $(STAMP)
	$(TOOL) parity $(if $(PARITY_BUILD),--build-dir $(PARITY_BUILD))

# `-m "not slow"` is pyproject.toml's addopts; --fast (tests/conftest.py) also leaves out the
# tests that need llama.cpp's build or source, or write a real-size model
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest --fast $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -s $(PYTEST_ARGS)

pr: build
	$(TOOL) pr

canary: $(STAMP)
	$(TOOL) rebase --onto $(CANARY_ONTO) --canary --prove --build-stacks $(if $(CANARY_DIR),--canary-dir $(CANARY_DIR)) $(CANARY_ARGS)

bench: patch
	$(TOOL) bench $(BENCH_ARGS)

bench-rpc: patch
	$(BIN)/python -m llamacpp_mla_port.bench.rpc

bench-auto: build
	$(BIN)/python -m llamacpp_mla_port.bench.auto_length $(BENCH_AUTO_ARGS)

device-check: build
	$(TOOL) device-check $(if $(filter 1,$(DRY_RUN)),--dry-run)

harness-diff: patch
	$(TOOL) harness-diff $(HARNESS_ARGS)

upstream-bench: $(STAMP)
	$(TOOL) upstream-bench $(UPSTREAM_BENCH_ARGS)

clean-work:
	rm -rf work work-canary

clean: clean-work
	rm -rf $(VENV) .pytest_cache .hypothesis
