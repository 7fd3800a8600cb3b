# Both `make demo` and `make test` create .venv when it is missing and install
# the project with everything it needs; running them again reinstalls nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.strideguard-installed

.PHONY: demo check test test-long test-torch2.15 test-torch2.15-all test-torch2.14 test-robots rehearse-gpu bench zoo fuzz clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS=ignore $(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -c constraints.txt -e '.[executorch,cuda,dev,zoo,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m strideguard demo

# The tiers (tests/tiers.py): `check` runs what neither compiles, lowers nor starts Python processes (under
# two minutes);
# `test` runs everything but the `long` tier, which `test-long` runs: kept failures replayed in
# the whole fuzz batches they were found in.
# Two workers, the two cores both busy: each file's tests on one worker (its module fixtures compile once),
# but the zoo's models and the kept failures spread over both (tests/conftest.py, SPREAD_FILES).
PARALLEL := -n 2 --dist loadfile

check: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not compiles and not lowers and not commands and not long"

test: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not long"

test-long: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m long

bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/lowering_cost.py
	$(PY) bench/pushdown.py
	$(PY) bench/pad_mm.py

zoo: $(STAMP)
	$(PY) bench/zoo.py

# A fresh seed each run, printed first and last; FUZZ_SEED=N replays that run's programs, batch by batch.
FUZZ_MINUTES ?= 20
FUZZ_SEED ?=
fuzz: $(STAMP)
	$(PY) -m pytest -q -m long tests/test_generated_regressions.py
	$(PY) -m pytest -q tests/test_generated.py --fuzz-minutes=$(FUZZ_MINUTES) $(if $(FUZZ_SEED),--fuzz-seed=$(FUZZ_SEED))

# The second lane: the newest torch served here (2.15.0), without ExecuTorch, as a plain
# AOTInductor user runs strideguard; the ExecuTorch tests are skipped, each with its reason. A fresh clone
# with torch 2.15.0 passes every file (make test-torch2.15-all); CI leaves out TORCH_INDEPENDENT_TESTS.
LANE2 := .venv-torch2.15
LANE2_STAMP := $(LANE2)/.strideguard-installed

# A lane's environment without ExecuTorch: $(1) the folder, $(2) its constraints file.
define torch_lane
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	PYTHONWARNINGS=ignore $(1)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(1)/bin/python -m pip install -q -c $(2) -e '.[cuda,dev,zoo,plot]'
	touch $(1)/.strideguard-installed
endef

$(LANE2_STAMP): pyproject.toml constraints-torch2.15.txt
	$(call torch_lane,$(LANE2),constraints-torch2.15.txt)

# Lane 2 leaves out the files that read nothing of torch that changes between minors: the command line's
# budgets and writes, its words and its docs (hostile files, signals, races, linear-time text, option checks).
# Lane 1 runs them; what reads a torch release's files (the loader, the command line's compile and verify) runs in both.
TORCH_INDEPENDENT_TESTS := tests/test_bounded.py tests/test_output_safety.py tests/test_linear_text.py \
	tests/test_verify_arguments.py tests/test_docs.py tests/test_architecture.py tests/test_stride_order.py

test-torch2.15: $(LANE2_STAMP)
	$(LANE2)/bin/python -m pytest -q $(PARALLEL) -m "not long" $(addprefix --ignore=,$(TORCH_INDEPENDENT_TESTS))

test-torch2.15-all: $(LANE2_STAMP)
	$(LANE2)/bin/python -m pytest -q $(PARALLEL) -m "not long"

# The minor between lanes 1 and 2 (torch 2.14.1, no ExecuTorch), kept tested where the minor matters: the tests
# that read torch's internals (the fake device's CUDA lowering, the decisions left to the device, the lowerings
# that changed between minors, the proofs) and the regressions first found on 2.14 (pushdown, size-one strides,
# views of views). The other files do not depend on the minor; lanes 1 and 2 run them.
LANE214 := .venv-torch2.14
LANE214_STAMP := $(LANE214)/.strideguard-installed
TORCH_MINOR_TESTS := tests/test_device_lowering.py tests/test_decided_on_the_device.py tests/test_torch_versions.py \
	tests/test_proven.py tests/test_pushdown.py tests/test_inductor_size_one_strides.py tests/test_views_of_views.py

$(LANE214_STAMP): pyproject.toml constraints-torch2.14.txt
	$(call torch_lane,$(LANE214),constraints-torch2.14.txt)

test-torch2.14: $(LANE214_STAMP)
	$(LANE214)/bin/python -m pytest -q $(PARALLEL) -m "not long" $(TORCH_MINOR_TESTS)

# The third lane: LeRobot's policies in the zoo (tests/robots.py). LeRobot needs Python 3.12: the newest
# 3.12 pyenv has, else python3.12 on the PATH. Its own pins (torch<2.12) are not taken: --no-deps.
ROBOTS_PYTHON ?= $(shell v=$$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1); \
	if [ -n "$$v" ]; then echo "$$(pyenv root)/versions/$$v/bin/python"; else command -v python3.12; fi)
LANE3 := .venv-robots
LANE3_STAMP := $(LANE3)/.strideguard-installed

$(LANE3_STAMP): pyproject.toml constraints-robots.txt
	test -n "$(ROBOTS_PYTHON)" || { echo "make test-robots needs Python 3.12" >&2; exit 2; }
	test -x $(LANE3)/bin/python || $(ROBOTS_PYTHON) -m venv $(LANE3)
	PYTHONWARNINGS=ignore $(LANE3)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(LANE3)/bin/python -m pip install -q -c constraints-robots.txt torchvision -e '.[executorch,dev,zoo]'
	PYTHONWARNINGS=ignore $(LANE3)/bin/python -m pip install -q --no-deps -c constraints-robots.txt lerobot
	PYTHONWARNINGS=ignore $(LANE3)/bin/python -m pip install -q -c constraints-robots.txt einops draccus gymnasium \
		safetensors termcolor opencv-python-headless
	touch $(LANE3_STAMP)

test-robots: $(LANE3_STAMP)
	$(LANE3)/bin/python -m pytest -q -n 2 tests/test_zoo.py -k lerobot

# The GPU machines' own environment, rehearsed on the CPU: Python 3.12 (found as for lane 3) with torch 2.11.0,
# Triton 3.6.0, pytest and hypothesis, and nothing else; strideguard is not installed, since bench/gpu.sh
# imports it from the checkout there. `rehearse-gpu` runs the whole of bench/gpu.sh in it, each step in its
# CPU form under the limit it has on the GPU, and fails if any step fails or runs past its limit.
GPU_PYTHON ?= $(ROBOTS_PYTHON)
GPU_ENV := .venv-gpu
GPU_STAMP := $(GPU_ENV)/.installed

$(GPU_STAMP): constraints-gpu.txt
	test -n "$(GPU_PYTHON)" || { echo "make rehearse-gpu needs Python 3.12" >&2; exit 2; }
	test -x $(GPU_ENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_ENV)
	PYTHONWARNINGS=ignore $(GPU_ENV)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(GPU_ENV)/bin/python -m pip install -q -c constraints-gpu.txt torch triton pytest hypothesis
	touch $(GPU_STAMP)

rehearse-gpu: $(GPU_STAMP)
	PYTHON=$(GPU_ENV)/bin/python STRIDEGUARD_REHEARSE_ON_CPU=1 bash bench/gpu.sh

clean:
	rm -rf $(VENV) $(LANE2) $(LANE214) $(LANE3) $(GPU_ENV) build *.egg-info
