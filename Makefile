# Set-up in two commands after the clone (README, Quick start):
#   make demo   creates .venv, installs the workflow (envs/requirements.txt, with this repository's
#               l1bench package) and runs the embedded CPU demo to its tables in results/demo/
#   make test   also installs the test tools (envs/requirements-dev.txt) and runs the tests
#               (PYTEST_ARGS='-m "not slow"' leaves out the workflow's end-to-end runs)
# Where no GPU is visible (no nvidia-smi), torch's CPU build is installed first, by itself, from
# PyTorch's CPU index, so that pip does not pull the CUDA build (2.8 GB); the version is the one
# envs/requirements.txt pins. On a GPU, and offline: docs/running.md.
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

BIN := $(VENV)/bin
TORCH := $(shell grep -m1 '^torch==' envs/requirements.txt)

.PHONY: demo test install install-dev

demo: install
	$(BIN)/snakemake --cores $(CORES) --config device=demo

test: install-dev
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: envs/requirements.txt pyproject.toml | $(BIN)/python
	command -v nvidia-smi >/dev/null || $(BIN)/python -m pip install "$(TORCH)" --index-url $(TORCH_CPU_INDEX)
	$(BIN)/python -m pip install -r envs/requirements.txt
	touch $@

$(VENV)/.installed-dev: envs/requirements-dev.txt envs/requirements-slurm.txt $(VENV)/.installed
	$(BIN)/python -m pip install -r envs/requirements-dev.txt
	touch $@
