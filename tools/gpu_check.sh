#!/usr/bin/env bash
# The whole GPU verification in one command. On a GPU machine (possibly without network; Python 3.12 with
# torch, lightning, numpy, OpenCV already there), with `.gpu/wheels` copied there from `make gpu-wheels`:
#
#   bash tools/gpu_check.sh                 # installs the carried wheels offline, then tools/gpu_check.py
#   bash tools/gpu_check.sh --cpu-dry-run   # here, in .venv: tiny sizes on the CPU, same parts, same report
#
# The wheels go into a separate target folder (/tmp/rpm-site) on PYTHONPATH with --no-deps, so the machine's
# torch, numpy and OpenCV are never touched; rpm_lib itself is put on PYTHONPATH and its console scripts are
# installed the same way. Never stops at the first failure: tools/gpu_check.py reports every part.
set -uo pipefail
cd "$(dirname "$0")/.."
export NO_ALBUMENTATIONS_UPDATE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg

if [[ " $* " == *" --cpu-dry-run "* ]]; then
    PY=${PYTHON:-.venv/bin/python}
    [[ -x "$PY" ]] || PY=python3
    export PATH="$(dirname "$PY"):$PATH"
    exec "$PY" tools/gpu_check.py "$@"
fi

source tools/gpu_env.sh
exec "$PY" tools/gpu_check.py "$@"
