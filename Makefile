# paracube — two entry points on a fresh machine:
#   make demo   create the environment and train the default model with 3D parallelism
#   make test   create the environment and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject.toml: the CPU build, never a CUDA download.
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/paracube train --dp 2 --tp 2 --pp 2 --sequence-parallel --schedule 1f1b \
		--model tiny --steps 150 --micro-batch 4 --microbatches 4 --eval-every 50 --metrics runs/demo.jsonl --metrics-mode overwrite

# The tests that start no ranks (tests/conftest.py: in_process) two at a time, one per core;
# then those that start ranks, one at a time (their collectives and timeouts get the cores).
test: lint
	$(PY) -m pytest -q -n 2 -m in_process
	$(PY) -m pytest -q -m "not in_process"

# ruff (lint + format check) and mypy over the package; configured in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Benchmarks run in their own environment with the optional peers (docs/peers.md);
# the test environment never gets them. torch stays at the pinned 2.13.0.
BENCH := .venv-bench
$(BENCH)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH)
	$(BENCH)/bin/python -m pip install --quiet -e '.[hf]'
	$(BENCH)/bin/python -m pip install --quiet --no-deps megatron-core==0.16.1 deepspeed==0.19.8
	$(BENCH)/bin/python -m pip install --quiet einops hjson msgpack ninja packaging psutil py-cpuinfo pydantic
	touch $(BENCH)/.installed

bench: $(BENCH)/.installed
	$(BENCH)/bin/python benchmarks/bench_data_parallel.py --out benchmarks/results/data_parallel.json
	$(BENCH)/bin/python benchmarks/bench_tensor_parallel.py --out benchmarks/results/tensor_parallel.json
	DS_ACCELERATOR=cpu $(BENCH)/bin/python benchmarks/bench_pipeline.py --out benchmarks/results/pipeline.json
	DS_ACCELERATOR=cpu $(BENCH)/bin/python benchmarks/bench_zero.py --out benchmarks/results/zero.json
	$(BENCH)/bin/python benchmarks/bench_recompute.py --out benchmarks/results/recompute.json
	$(BENCH)/bin/python benchmarks/bench_compile.py --out benchmarks/results/compile.json
	$(BENCH)/bin/python benchmarks/bench_checkpoint.py --out benchmarks/results/checkpoint.json
	$(BENCH)/bin/python benchmarks/bench_timing_gather.py --out benchmarks/results/timing_gather.json
	$(BENCH)/bin/python benchmarks/bench_dp_balance.py --out benchmarks/results/dp_balance.json
	$(BENCH)/bin/python benchmarks/bench_pp_balance.py --out benchmarks/results/pp_balance.json
	$(BENCH)/bin/python benchmarks/bench_compress.py --out benchmarks/results/compress.json
	$(BENCH)/bin/python benchmarks/bench_convergence.py --out benchmarks/results/convergence.json --plot docs/images/convergence.png
	$(BENCH)/bin/python benchmarks/bench_async.py --out benchmarks/results/async.json
	$(BENCH)/bin/python benchmarks/bench_tokenized.py --out benchmarks/results/tokenized.json
	# needs root for network namespaces: says why and goes on without them
	-$(BENCH)/bin/python benchmarks/bench_shaped_link.py --out benchmarks/results/shaped_link.json
	$(BENCH)/bin/python benchmarks/bench_planner.py --out benchmarks/results/planner.json
	$(BENCH)/bin/python benchmarks/bench_planner_published.py --out benchmarks/results/planner_published.json
	$(BENCH)/bin/python benchmarks/bench_startup.py --out benchmarks/results/startup.json

clean:
	rm -rf $(VENV) $(BENCH) runs *.egg-info
