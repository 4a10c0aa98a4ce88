# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedray-installed
# pytest workers (pytest-xdist; each has its own local Ray, whole test files per worker): the
# suite mostly waits on process and actor starts, so 2 workers on 2 cores nearly halve it
TEST_WORKERS ?= 2

.PHONY: demo tour test docs preflight-demo preflight-test lint bench flower-venv-background clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# each target checks its prerequisites first (one line naming what is missing), before any download
preflight-%:
	@PYTHON=$(PYTHON) VENV=$(VENV) sh scripts/preflight.sh $*

demo: preflight-demo $(STAMP)
	$(PY) jobs/favor_blogtext.py --out runs/favor-blogtext

tour: preflight-demo $(STAMP)
	$(VENV)/bin/fedray demo

# .venv-flower (Flower pins its own Ray; the interoperability tests need it) builds in the
# background meanwhile: the tests run the same script, which waits for it (it takes a lock)
flower-venv-background:
	@(bash benchmarks/setup_flower_venv.sh > .venv-flower.log 2>&1 &)

test: preflight-test flower-venv-background $(STAMP)
	$(VENV)/bin/ruff check fedray tests jobs benchmarks docs examples
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25
	VENV=$(VENV) bash tests/cluster/run.sh

# the documentation site into site/ (--strict: a broken link, a missing reference or any
# warning fails the build); the tests build it too (tests/test_docs.py)
docs: preflight-demo $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

bench: $(STAMP)
	bash benchmarks/setup_flower_venv.sh
	bash benchmarks/setup_pfl_venv.sh
	$(PY) benchmarks/sim_overhead.py --clients 10 50 100 --fedray-warm

clean:
	rm -rf $(VENV) .venv-flower runs site
