# Sourced by the scripts that run on a GPU machine (possibly without network) (tools/gpu_check.sh, tools/campaign/gpu_slice.sh), from the
# repository root: makes rpm_lib and the wheels carried in .gpu/wheels (`make gpu-wheels`) importable without
# network, beside the machine's own torch, numpy and OpenCV, which are never touched. Sets PY (the interpreter),
# PYTHONPATH, PATH (rpm-train, rpm-batch, ...) and JUPYTER_PATH (a python3 kernel for papermill).
# Sourcing it again in the same shell (a script that sources it calls another that does) installs nothing twice.
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu/wheels}
SITE=${RPM_GPU_SITE:-/tmp/rpm-site}
[[ -n "${RPM_GPU_ENV:-}" ]] && return 0
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu_env: no wheels in $WHEELS (run \`make gpu-wheels\` here and copy .gpu there)" >&2
else
    # A second run on a machine still up finds the same wheels installed (the stamp: their names, sizes and
    # checksums, and this interpreter): installing them again is skipped (slice 4's first ~7 s, by estimate, went to
    # installing them and unpacking the state).
    stamp=$( (cd "$WHEELS" && cksum ./*.whl; "$PY" -V; cksum "$OLDPWD/pyproject.toml") 2>&1)
    if [[ -f "$SITE/.rpm-wheels" && "$(cat "$SITE/.rpm-wheels")" == "$stamp" ]]; then
        echo "gpu_env: the carried wheels are installed already (a warm machine)" >&2
    else
        rm -f "$SITE/.rpm-wheels"
        installed=1
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
            || { installed=0; echo "gpu_env: installing the carried wheels failed; continuing with what is there" >&2; }
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE/rpm" . \
            || { installed=0; echo "gpu_env: installing rpm_lib's console scripts failed" >&2; }
        (( installed )) && echo "$stamp" >"$SITE/.rpm-wheels"
    fi
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$SITE/rpm/bin:$PATH"
# The papermill kernel: a kernelspec for this interpreter, found through JUPYTER_PATH.
"$PY" -m ipykernel install --prefix /tmp/rpm-jupyter --name python3 >/dev/null 2>&1 \
    || echo "gpu_env: ipykernel kernelspec could not be installed" >&2
export JUPYTER_PATH="/tmp/rpm-jupyter/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
export RPM_GPU_ENV=1
