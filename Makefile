# Both `make demo` and `make test` create .venv when it is missing and install
# the project with everything it needs; running them again reinstalls nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.strideguard-installed

.PHONY: demo test test-torch2.14 bench zoo fuzz clean

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

# The second lane: the newest torch served here (2.14.1), without ExecuTorch, as a plain
# AOTInductor user runs strideguard; the ExecuTorch tests are skipped, each with its reason.
LANE2 := .venv-torch2.14
LANE2_STAMP := $(LANE2)/.strideguard-installed

$(LANE2_STAMP): pyproject.toml constraints-torch2.14.txt
	test -x $(LANE2)/bin/python || $(PYTHON) -m venv $(LANE2)
	PYTHONWARNINGS=ignore $(LANE2)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(LANE2)/bin/python -m pip install -q -c constraints-torch2.14.txt -e '.[dev,zoo,plot]'
	touch $(LANE2_STAMP)

test-torch2.14: $(LANE2_STAMP)
	$(LANE2)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(LANE2) build *.egg-info
