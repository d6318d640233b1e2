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
#   BUILD_ARGS="--cmake-arg -DGGML_CUDA=ON"
#   PYTEST_ARGS="-k engine -x"
#   BENCH_ARGS="--threads 4 --stages models,floors,passes"
PATCH_ARGS ?=
BUILD_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help venv patch check build smoke test test-slow pr bench clean-work clean

help:
	@echo "make patch       pinned llama.cpp + the series applied in ./work/llama.cpp; patches/ exported"
	@echo "make build       CMake build of the patched tree in ./work/build (after make patch)"
	@echo "make check       fail when patches/ drift from a fresh render of templates/"
	@echo "make smoke       build, make fixtures, parity + lossless proof, one JSON report"
	@echo "make test        the test suite (drift check, engine, runtime, converter, proof, doctor)"
	@echo "make test-slow   real-size checks: real-config conversion, the real-size pair lossless (~20 GB disk)"
	@echo "make pr          upstream kit: per-commit build/lint checks + evidence folder"
	@echo "make bench       real-size draft vs measured floors, PyTorch, KV, tool timings: work/bench/report.md"
	@echo "make clean-work  delete the tool-owned work dir ./work (llama.cpp tree + build)"

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
	$(TOOL) build $(BUILD_ARGS)

smoke: build
	$(TOOL) smoke

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -s $(PYTEST_ARGS)

pr: build
	$(TOOL) pr

bench: patch
	$(TOOL) bench $(BENCH_ARGS)

clean-work:
	rm -rf work

clean: clean-work
	rm -rf $(VENV) .pytest_cache .hypothesis
