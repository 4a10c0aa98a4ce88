# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedray-installed

.PHONY: demo tour test lint bench flower-venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) jobs/favor_blogtext.py --out runs/favor-blogtext

tour: $(STAMP)
	$(VENV)/bin/fedray demo

test: $(STAMP)
	$(VENV)/bin/ruff check fedray tests jobs benchmarks
	$(PY) -m pytest -q -p no:cacheprovider --durations=25
	VENV=$(VENV) bash tests/cluster/run.sh

bench: $(STAMP)
	bash benchmarks/setup_flower_venv.sh
	bash benchmarks/setup_pfl_venv.sh
	$(PY) benchmarks/sim_overhead.py --clients 10 50 100 --fedray-warm

clean:
	rm -rf $(VENV) .venv-flower runs
