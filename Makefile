# demo and test set themselves up on a fresh machine: a local virtual environment with PyTorch (the CPU wheel where
# pip's sources have it, see TORCH_SPEC). bench and
# gpu-test run with the machine's python3, on a GPU machine where the project is installed.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch from pip's configured sources: CI's find-links hold the CPU wheel (no multi-GB CUDA download); elsewhere
# ask for it: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make test TORCH_SPEC=torch==2.13.0+cpu.
# On a GPU machine, install the project yourself.
TORCH_SPEC ?= torch==2.13.0
# Triton pinned too: its Gluon API renames things between releases (tests/sm90_compile.py compiles the
# Gluon kernel with it). The H200 runs 3.6; attention_fwd_hopper.py compiles with both.
TRITON_SPEC ?= triton==3.9.0

.PHONY: demo test bench gpu-test clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "setuptools>=64"
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(PY) -m pip install -q --no-build-isolation -e ".[test,demo,bench]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m attention.demo

# The CPU suite as CI runs it, whatever the host: with a GPU visible, Triton would compile the kernels for it and the
# tests that hand them CPU tensors would fail (they need the interpreter, which conftest turns on only without CUDA).
test: $(VENV)/.installed
	CUDA_VISIBLE_DEVICES= $(PY) -m pytest -q -m "not gpu" -p no:cacheprovider

# On a CUDA machine with the project's dependencies installed (parallel shards, logs in gpu-test-logs/).
gpu-test:
	bash scripts/gpu_tests.sh

bench:
	python3 -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info
