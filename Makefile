# paracube — two entry points on a fresh machine:
#   make demo   create the environment and train the default model with data parallelism
#   make test   create the environment and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject.toml: the CPU build, never a CUDA download.
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/paracube train --dp 2 --model tiny --steps 300 --micro-batch 8 --grad-accum 2 \
		--eval-every 50 --metrics runs/demo.jsonl

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_data_parallel.py --out benchmarks/results/data_parallel.json

clean:
	rm -rf $(VENV) runs *.egg-info
