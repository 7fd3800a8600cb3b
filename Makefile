# Both `make demo` and `make test` create .venv when it is missing and install
# the project with everything it needs; running them again reinstalls nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.strideguard-installed

.PHONY: demo test bench zoo fuzz clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS=ignore $(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -c constraints.txt -e '.[executorch,dev,zoo,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m strideguard demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/lowering_cost.py
	$(PY) bench/pushdown.py

zoo: $(STAMP)
	$(PY) bench/zoo.py

FUZZ_MINUTES ?= 20
fuzz: $(STAMP)
	$(PY) -m pytest -q tests/test_generated.py --fuzz-minutes=$(FUZZ_MINUTES)

clean:
	rm -rf $(VENV) build *.egg-info
