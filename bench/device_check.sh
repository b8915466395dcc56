#!/usr/bin/env bash
# The whole GPU verification in one command (issue 10). On the lent GPU machine (no network; Python 3.12 with
# torch, lightning, numpy, OpenCV already there), carrying `.device/wheels` from `make device-wheels`:
#
#   bash bench/device_check.sh                 # installs the carried wheels offline, then bench/device_check.py
#   bash bench/device_check.sh --cpu-dry-run   # here, in .venv: tiny sizes on the CPU, same parts, same report
#
# The wheels go into a separate target folder (/tmp/rpm-site) on PYTHONPATH with --no-deps, so the machine's
# torch, numpy and OpenCV are never touched; rpm_lib itself is put on PYTHONPATH and its console scripts are
# installed the same way. Never stops at the first failure: bench/device_check.py reports every part.
set -uo pipefail
cd "$(dirname "$0")/.."
export NO_ALBUMENTATIONS_UPDATE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg

if [[ " $* " == *" --cpu-dry-run "* ]]; then
    PY=${PYTHON:-.venv/bin/python}
    [[ -x "$PY" ]] || PY=python3
    export PATH="$(dirname "$PY"):$PATH"
    exec "$PY" bench/device_check.py "$@"
fi

PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.device/wheels}
SITE=/tmp/rpm-site
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "device_check: no wheels in $WHEELS (run \`make device-wheels\` here and carry .device)" >&2
else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
        || echo "device_check: installing the carried wheels failed; continuing with what is there" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE/rpm" . \
        || echo "device_check: installing rpm_lib's console scripts failed" >&2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$SITE/rpm/bin:$PATH"
# The papermill kernel: a kernelspec for this interpreter, found through JUPYTER_PATH.
"$PY" -m ipykernel install --prefix /tmp/rpm-jupyter --name python3 >/dev/null 2>&1 \
    || echo "device_check: ipykernel kernelspec could not be installed" >&2
export JUPYTER_PATH="/tmp/rpm-jupyter/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
exec "$PY" bench/device_check.py "$@"
