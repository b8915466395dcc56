# Two commands do all set-up on a fresh Linux machine with Python 3.11:
#   make demo   generated I-RAVEN data -> cache -> gallery (and, later, short trainings) under runs/demo/
#   make test   the whole suite
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export NO_ALBUMENTATIONS_UPDATE := 1
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg

.PHONY: install test test-browser test-slurm demo bench clean-venv dev gpu-wheels

# pip compiles what it installs one file at a time; compileall does the same on every core (a file that is not valid
# Python 3.11, such as torch's Python 3.12 test helpers, is skipped, as pip skips it). rpm_lib is compiled too: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile the modules it imports again. The packages'
# own test suites (their tests/ folders, a sixth of the files) are left out: nothing here imports them.
define COMPILE_ALL
import compileall, glob, re
for folder in glob.glob("$(VENV)/lib/python3*/site-packages") + ["rpm_lib"]:
    compileall.compile_dir(folder, quiet=2, workers=0, rx=re.compile(r"/tests/"))
endef
export COMPILE_ALL

# The exact pins of requirements.txt first, then rpm_lib itself with --no-deps: pyproject.toml only declares
# compatible ranges (for `pip install .` elsewhere), which tests/test_packaging.py keeps admitting these pins.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile --no-deps --no-build-isolation -e .
	$(PY) -c "$$COMPILE_ALL"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (rpm_lib)" >/dev/null
	touch $(STAMP)

install: $(STAMP)

dev: $(STAMP)
	$(PY) -m pip install --quiet -r requirements-dev.txt

# ruff (pyproject.toml [tool.ruff]) and the layers of rpm_lib (import-linter, [tool.importlinter]) before the suite.
# The suite runs on TEST_PROCESSES processes (pytest-xdist), a test file per process at a time; many tests wait on
# kernels, subprocesses and SLURM, so two processes keep a 2-core machine busy. TEST_PROCESSES=0 runs it in one.
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest tests -q -p no:cacheprovider --timeout=900 -n $(TEST_PROCESSES) --dist loadfile

# Only the notebooks in JupyterLab in headless Chromium (Debian: `apt-get install -y chromium`; skipped with
# that hint when Chromium is missing; .ci/run installs it).
test-browser: $(STAMP)
	$(PY) -m pytest tests/browser -q -p no:cacheprovider --timeout=900 -rs

# Only the grid-on-SLURM tests: a one-node SLURM on 127.0.0.1 (Debian: `apt-get install -y slurm-wlm`, as root;
# skipped with that hint otherwise; .ci/run installs it).
test-slurm: $(STAMP)
	$(PY) -m pytest tests/test_slurm.py -q -p no:cacheprovider --timeout=900 -rs

demo: $(STAMP)
	$(PY) -m rpm_lib.demo --out runs/demo

bench: $(STAMP)
	$(PY) bench/bench_data.py
	$(PY) bench/bench_generate.py
	$(PY) bench/bench_models.py

# Wheels a GPU machine without network needs (everything rpm_lib uses beyond its image), into .gpu/wheels:
# copy .gpu there with the checkout, then `bash tools/gpu_check.sh` or `bash tools/campaign/gpu_slice.sh`.
gpu-wheels: $(STAMP)
	$(PY) tools/gpu_wheels.py --out .gpu/wheels

clean-venv:
	rm -rf $(VENV)
