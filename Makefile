# Two commands on a fresh machine:   make demo   (train the default glyphs recipe)   make test
# Each creates .venv and installs what it needs. On machines with a CPU-only torch wheel on disk
# (torch==2.13.0), that build is installed first so pip never fetches a multi-GB CUDA build;
# elsewhere set TORCH=torch (or any spec) to take your usual build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

.PHONY: demo test test-slow test-gpu test-gpu-1 test-gpu-2 lint
demo: $(VENV)/.installed
	$(VENV)/bin/omnialign train --resume auto

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q --runslow

# The GPU tier (docs/testing.md), on a machine with a CUDA device and the packages already installed (no venv):
# the CPU suite with its tiny models on the GPU (GPU_WORKERS pytest-xdist processes share the card), then every
# released architecture at full size with random weights, one test at a time.
# Each phase is a target of its own (test-gpu-1, test-gpu-2), for machines that limit a command's time; phase 2
# takes K, a pytest -k expression, or PART, one of four named parts (on one H100: cuda 5:00-6:13, sd35 6:53-7:35,
# qwen_flux 5:02, flux2 1:54 with its two H200-sized tests skipped; on one H200 cuda
# 5:52 with cold compile caches, qwen_flux 4:28, flux2 3:02):
#   make test-gpu-2 PART=cuda; make test-gpu-2 PART=sd35; make test-gpu-2 PART=qwen_flux; make test-gpu-2 PART=flux2
# Phase 1 and PART=cuda can share one call (6:50 for both on a freshly started H200, phase 1 started first):
#   make test-gpu-1 > p1.log 2>&1 & make test-gpu-2 PART=cuda; wait
# Together the parts are every GPU test, each once (tests/test_gpu_parts.py fails on a GPU test that no part or two
# parts select). Phase 2
# prints each test's output (peak memory, log-prob gaps) and every phase of a test that took over 5 s.
GPU_WORKERS ?= 8
PART_cuda = noise_on_cuda or flash_decode or fused_draw or bf16_head or compiled_step or full_width or test_on_cuda or cuda_graph_replay or attention_reach or validation_draws or wan21 or wan22
PART_sd35 = sd35 or qwen3_omni or gspo or deterministic or tiny_thinker or (compiled and not compiled_step and not full_width and not flux)
PART_qwen_flux = qwen_image or (flux and not flux2)
PART_flux2 = flux2 or zimage or ltx2
PART ?=
K ?= $(PART_$(PART))
test-gpu: test-gpu-1 test-gpu-2
test-gpu-1:
	$(PYTHON) -c "import torch; assert torch.cuda.is_available(), 'make test-gpu needs a CUDA device'"
	$(PYTHON) -m pytest -q -p no:cacheprovider -m "not gpu" -n $(GPU_WORKERS)
test-gpu-2:
	$(PYTHON) -c "import torch; assert torch.cuda.is_available(), 'make test-gpu needs a CUDA device'"
	$(PYTHON) -m pytest -q -p no:cacheprovider -m gpu -rP --durations=0 --durations-min=5 $(if $(K),-k "$(K)")

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check . && $(VENV)/bin/ruff check .
