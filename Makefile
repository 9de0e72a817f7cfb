# Two entry points for a fresh machine: `make demo` (set up + train on the bundled data) and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: install demo test bench gpu-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install --quiet -e ".[dev,onnx]"
	touch $@

install: $(VENV)/.installed

demo: install  ## train ESD-MBENet (ResNet-18) on data/ucmerced-mini on the CPU and print its accuracy
	$(PY) scripts/train.py overwrite=true
	@echo "next: source $(VENV)/bin/activate (rsnet is installed there), then README.md, 'Your first hour'"

test: install  ## the test suite (unit + end-to-end runs of the scripts on tiny data), a test process per core (more beside busy processes: tests/conftest.py)
	$(PY) -m pytest -q -n auto --dist worksteal

bench: install  ## every benchmark of benchmarks/, one after the other
	for script in benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

gpu-check: install  ## pass/fail table of every trainer x model on the visible GPUs, then steady-state throughput
	$(PY) benchmarks/gpu_check.py
	$(PY) benchmarks/bench_step.py --require-cuda
	$(PY) benchmarks/bench_compile.py --require-cuda
	$(PY) benchmarks/gpu_throughput.py
