#!/usr/bin/env bash
# One slice of the Table 1 campaign on a GPU machine that may be offline and time-limited: in ~10 minutes,
#
#   1. restore the runs' resumable state from results/table1_scl_gpu (committed after every slice): each run from
#      its own archive, state/<grid>__<run>.tar.gz, else from the base layer state.tar.gz (one archive of every
#      run, as slices 1-6 committed it), by `tools/campaign/record.py --restore`,
#   2. run `rpm-batch configs/table1_scl_gpu.yaml` with a time budget: it regenerates the data (deterministic;
#      each run checks the fingerprint it recorded), then trains the row's unfinished runs on the one GPU until
#      about CAMPAIGN_MINUTES (default 9) minutes after this script started, each stopping at a step boundary with
#      a resumable state (CAMPAIGN_JOBS=1 at a time by default, see JOBS below),
#   3. pack each run into its own archive, CAMPAIGN_OUT/state/<grid>__<run>.tar.gz (`record.py --pack`: rpm-batch
#      pack --compact --run), and the slice's reports into CAMPAIGN_OUT/slice.tar.gz: progress.{md,json} (epochs,
#      val accuracy, each run's seconds to its first step), table1.md, slice.json (card, times, exit status, and
#      phases_s: the seconds from this script's start at which the environment was ready, the state unpacked, the
#      batch ended and the state packed) and gpu_util.csv (nvidia-smi every 5 s). One archive of reports, so that
#      a slice returns at most 8 files: the five runs' archives and slice.tar.gz.
#
# Then, back on your own machine: `python tools/campaign/record.py FOLDER` (FOLDER: a copy of CAMPAIGN_OUT) stores
# the archives of the runs that changed and appends the slice to results/table1_scl_gpu/slices.jsonl and
# docs/reproduction-gpu.md; commit (each commit then adds only the changed runs' archives).
#
#   CAMPAIGN_OUT=DIR bash tools/campaign/gpu_slice.sh  # on the GPU machine, with .gpu copied there (make gpu-wheels);
#                                                      # DIR gets the state and reports (default /tmp/campaign-out)
#   bash tools/campaign/gpu_slice.sh --cpu-dry-run     # here: configs/table1_scl_tiny.yaml in a temporary folder, two
#                                                      # slices (the second resumes the first's archives)
#
# On your own GPU, without slices: rpm-batch configs/table1_scl_gpu.yaml --jobs 5 --cuda-devices 0 --cuda-mps \
#   --workers-per-run auto   (without --cuda-mps where NVIDIA's nvidia-cuda-mps-control is not installed)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export NO_ALBUMENTATIONS_UPDATE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
STARTED=$(date +%s)
# Runs trained at once; this decides what each commit of the state adds to the repository. Every run that trained
# in the slice and is still unfinished comes back with new checkpoints, 12 bytes per parameter (fp32 weights, Adam
# moments packed in bf16 by --compact, best weights): a 7.5 MB archive for SCL CE+AUX-sparse, 9.7 MB for an MLCL
# setup (8.6 and 11.1 MB unpacked). One at a time, in the grid's order (CE+AUX-sparse, then MLCL, then MLCL+AUG), a
# slice ends with at most one unfinished run whose state changed, and its commit adds at most ~12 MB (that run, and
# the small archive of one that finished; once, ~21 MB, when record.py retires the base layer early so that the
# next slice can still carry the state); three at a time, up to ~30 MB. The price is GPU time: on an H200, three
# runs at once through MPS trained 1.76x (CE+AUX-sparse) and 2.06x (MLCL+AUG) the problems per second of one run of
# the same code alone (2.21x and 2.04x one run of the earlier version ce69914; docs/reproduction-gpu.md, "Three runs
# at once, with and without MPS"): one at a time takes 1.8-2.1 times the GPU time. CAMPAIGN_JOBS=3 buys that back
# where the repository's growth matters less.
JOBS=${CAMPAIGN_JOBS:-1}
# A file coming back from the GPU machine may hold at most 16 MiB; one run's archive is under 10 MB for SCL (a
# larger encoder's would not come back: said below).
RETURN_BYTES=16777216
# Seconds kept after the batch for packing the state and writing the reports.
RESERVE=${CAMPAIGN_RESERVE:-25}

DRY=0
for arg in "$@"; do
    case $arg in
        --cpu-dry-run) DRY=1 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_campaign: error: unknown argument '$arg' (the options: --cpu-dry-run, --help)" >&2; exit 2 ;;
    esac
done

if (( DRY )); then
    PY=${PYTHON:-$REPO/.venv/bin/python}
    [[ -x "$PY" ]] || PY=$(command -v python3)
    export PATH="$(dirname "$PY"):$PATH"
    CONFIG=$REPO/configs/table1_scl_tiny.yaml
    WORK=${CAMPAIGN_WORK:-$(mktemp -d /tmp/gpu-campaign-dry.XXXXXX)}
    DEST=${CAMPAIGN_OUT:-$WORK/out}
    # Two slices: the first must stop runs unfinished for the second to resume them from their archives. A wall-clock
    # budget cannot promise that here: a run's start-up (its kernel importing torch and Lightning) took 7 s on a quiet
    # 2-core machine and outlasted a 2.5x budget on a busy one, while a long budget lets every run finish on a fast
    # machine. So by default ("epoch") the first slice asks each run to stop at its next step once it has written its
    # first checkpoint (an epoch's end), through the run's stop-request file as the batch's own backstop does; every
    # run then stops mid-stage, whatever the machine's speed, and EPOCH_SLICE_LIMIT seconds are only a limit.
    EPOCH_SLICE_LIMIT=400
    CAMPAIGN_BUDGETS=${CAMPAIGN_BUDGETS:-"epoch $EPOCH_SLICE_LIMIT"}
    BUDGETS=($CAMPAIGN_BUDGETS)
    DEVICES=()
    # The template path in the YAML is relative to the working folder: a private copy keeps the checkout clean.
    mkdir -p "$WORK/notebooks" && cp notebooks/03_train.ipynb "$WORK/notebooks/"
else
    source tools/gpu_env.sh
    CONFIG=$REPO/configs/table1_scl_gpu.yaml
    WORK=$REPO
    DEST=${CAMPAIGN_OUT:-/tmp/campaign-out}
    # CAMPAIGN_SECONDS (or CAMPAIGN_MINUTES) after this script started, the state is packed and the reports written.
    BUDGETS=(${CAMPAIGN_SECONDS:-$(( ${CAMPAIGN_MINUTES:-9} * 60 ))})
    DEVICES=(--cuda-devices 0)
fi
# CAMPAIGN_CUDA_MPS=1 (the default on the GPU; 0 turns it off): the runs share the GPU through a private CUDA MPS daemon
# (rpm-batch --cuda-mps), so that their kernels run side by side. Three SCL runs at once trained 1.51x (CE+AUX-sparse)
# and 1.42x (MLCL+AUG) the problems per second with it as without, side by side on one H200 (docs/reproduction-gpu.md).
# Only where NVIDIA's control program is: rpm-batch refuses --cuda-mps without it, which would fail the slice. Where
# the daemon will not start or its server fails, the slice goes on without MPS for the time left (below).
MPS=()
[[ ${CAMPAIGN_CUDA_MPS:-$(( DRY ? 0 : 1 ))} == 1 ]] && { "$PY" -c 'from rpm_lib.cuda_mps import find_control; find_control()' 2>/dev/null \
    && MPS=(--cuda-mps) || echo "gpu_campaign: the runs take turns on the GPU: nvidia-cuda-mps-control is not on this machine"; }
NAME=$(basename "$CONFIG" .yaml)
# The folder of the committed state (base state.tar.gz, per-run archives in state/); the dry run keeps its own.
STATE_HOME=$WORK/results/table1_scl_gpu
[[ $DRY == 0 ]] && STATE_HOME=$REPO/results/table1_scl_gpu
# The campaign's state layout: tools/campaign/record.py restores and packs it.
state() { "$PY" "$REPO/tools/campaign/record.py" "$@" --results "$STATE_HOME"; }
RUNS=runs/$NAME
mkdir -p "$DEST"
REPORTS=$(mktemp -d /tmp/gpu-campaign-reports.XXXXXX)
cd "$WORK"
# Where a slice's seconds go (slice.json phases_s): "<phase> <milliseconds since STARTED>" lines, beside the reports.
PHASES=$(mktemp /tmp/gpu-campaign-phases.XXXXXX)
mark() { echo "$1 $(( $(date +%s%N) / 1000000 - STARTED * 1000 ))" >>"$PHASES"; }
mark environment

SMI=
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 >"$REPORTS/gpu_util.csv" 2>/dev/null &
    SMI=$!
    trap 'kill $SMI 2>/dev/null' EXIT
fi

status=0
# Seconds slice $1's batch may train: the dry run's fixed budget ("epoch": each run stopped after its first
# checkpoint, within EPOCH_SLICE_LIMIT), else what CAMPAIGN_SECONDS leaves after the reserve.
budget_left() {
    if [[ $DRY == 1 ]]; then
        [[ ${BUDGETS[$1]} == epoch ]] && echo "$EPOCH_SLICE_LIMIT" || echo "${BUDGETS[$1]}"
    else
        echo $(( BUDGETS[$1] - ($(date +%s) - STARTED) - RESERVE ))
    fi
}
# The dry run's "epoch" slice: every unfinished run of $RUNS that holds a checkpoint is asked to stop at its next step
# (asked again every half second: `train` removes a request it finds at its start); on SIGTERM the requests are
# removed, so that the packed state holds none. (exec: the background job is this Python itself, which the kill
# below then reaches.)
stop_each_run_after_its_first_checkpoint() {
    exec "$PY" - "$RUNS" <<'PYTHON'
import signal, sys, time
from pathlib import Path

from rpm_lib.run_folder import CHECKPOINTS, find_run_folders, is_finished, request_stop, withdraw_stop_request

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
runs, asked = Path(sys.argv[1]), set()
try:
    while True:
        for run in find_run_folders(runs).runs if runs.is_dir() else ():
            if not is_finished(run) and any((run / CHECKPOINTS).glob("*/last.ckpt")) and request_stop(run):
                asked.add(run)
        time.sleep(0.5)
finally:
    for run in asked:
        withdraw_stop_request(run)
PYTHON
}
# The slice's batch for $1 seconds, with MPS where it is in use.
batch() { rpm-batch "$CONFIG" --jobs "$JOBS" "${DEVICES[@]}" "${MPS[@]}" --workers-per-run auto --time-budget "$1"; }

for number in "${!BUDGETS[@]}"; do
    # A second slice on the same machine finds the first slice's runs here, further than the state it carries (the
    # one committed before the first slice): those go on from where they are (rpm-batch unpack --keep-further).
    state --restore "$RUNS" || exit 2
    mark unpacked
    budget=$(budget_left "$number")
    if (( budget < 1 )); then
        # CAMPAIGN_SECONDS too small for the reserve (a short second slice on a still-running machine): the state
        # goes back as it came, and the slice says so instead of failing on rpm-batch's refusal of the budget
        echo "gpu_campaign: slice $number: no time left for training (${budget} s after the reserve of ${RESERVE} s)"
        status=75
    else
        echo "gpu_campaign: slice $number, time budget ${budget} s, $JOBS runs at a time"
        stopper=
        if [[ $DRY == 1 && ${BUDGETS[$number]} == epoch ]]; then
            echo "gpu_campaign: slice $number stops each run after its first checkpoint"
            stop_each_run_after_its_first_checkpoint &
            stopper=$!
        fi
        # rpm-batch's errors and warnings are kept (and shown after it ends) to see whether MPS failed
        errors=$(mktemp /tmp/gpu-campaign-errors.XXXXXX)
        batch "$budget" 2>"$errors"
        status=$?
        cat "$errors" >&2
        # MPS asked for and not working (the daemon refused to start: rpm-batch stops with status 2 before any run;
        # or its server failed, and the runs with it): the time left goes to the runs taking turns, rather than a
        # slice that trains nothing
        if (( ${#MPS[@]} )) && { { (( status == 2 )) && grep -q "mps-control\|MPS" "$errors"; } \
                || grep -q "MPS: the daemon's server failed to start" "$errors"; }; then
            MPS=()
            budget=$(budget_left "$number")
            echo "gpu_campaign: MPS did not work (above); the runs take turns on the GPU for the ${budget} s left"
            if (( budget >= 1 )); then
                batch "$budget"
                status=$?
            fi
        fi
        rm -f "$errors"
        if [[ -n $stopper ]]; then
            kill "$stopper" 2>/dev/null; wait "$stopper" 2>/dev/null
        fi
    fi
    mark batch_ended
    [[ -f "$RUNS/table1.md" ]] && cp "$RUNS/table1.md" "$REPORTS/table1.md"
    # Every run into its own archive beside the committed ones (the next dry-run slice resumes from them);
    # tools/campaign/record.py keeps only those whose state changed. Where no run has begun (data generation and
    # start-up took the whole budget, and no state was committed) it packs nothing: the next slice starts the runs.
    state --pack "$RUNS" || exit 2
    mark packed
    if [[ $DRY == 1 ]]; then  # the next slice starts from the archive alone, as on a fresh machine
        rm -rf "$RUNS"
    fi
    echo "gpu_campaign: slice $number ended with status $status"
done

rm -rf "$DEST/state" && rm -f "$DEST/slice.tar.gz"
shopt -s nullglob
archives=("$STATE_HOME"/state/*.tar.gz)
if (( ${#archives[@]} == 0 )); then
    echo "gpu_campaign: no state to return (no run has begun)"
else
    mkdir -p "$DEST/state" && cp "${archives[@]}" "$DEST/state/"
    for archive in "${archives[@]}"; do
        (( $(stat -c %s "$archive") <= RETURN_BYTES )) \
            || echo "gpu_campaign: warning: $(basename "$archive") is over 16 MiB: it does not come back from a machine that returns at most that per file" >&2
    done
fi
[[ $DRY == 1 ]] && state --restore "$RUNS" >/dev/null
if [[ -d "$RUNS" ]]; then
    rpm-batch progress "$RUNS" --json-out "$REPORTS/progress.json" | tee "$REPORTS/progress.md"
fi
# The card's name from nvidia-smi and torch's version from its package record: importing torch and starting CUDA
# only for these took seconds of every slice on the GPU machine's slower cores.
DEVICE_NAME="cpu (dry run)"
if [[ $DRY == 0 ]] && command -v nvidia-smi >/dev/null 2>&1; then
    DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
"$PY" - "$REPORTS/slice.json" "$status" "$STARTED" "$DEVICE_NAME" "$PHASES" <<'PYTHON'
import json, sys, time
from importlib.metadata import PackageNotFoundError, version

import cv2
import numpy

out, status, started, device, phases = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
try:
    torch_version = version("torch")
except PackageNotFoundError:
    torch_version = None
# "<phase> <milliseconds since the start>" lines; a slice's later parts repeat a phase: the last one counts
marks = {}
for line in open(phases):
    name, ms = line.split()
    marks[name] = round(int(ms) / 1000, 1)
# OpenCV draws the regenerated data's pixels (rpm_lib.data.opencv_version): a change shows in the slice record
json.dump({"device": device or "unknown", "torch": torch_version, "opencv": cv2.__version__,
           "numpy": numpy.__version__, "exit_status": status, "started": started,
           "seconds": round(time.time() - started, 1), "phases_s": marks,
           "date": time.strftime("%Y-%m-%d", time.gmtime(started))}, open(out, "w"), indent=1)
PYTHON
rm -f "$PHASES"
[[ -n $SMI ]] && kill "$SMI" 2>/dev/null && wait "$SMI" 2>/dev/null
tar -czf "$DEST/slice.tar.gz" -C "$REPORTS" . && rm -rf "$REPORTS"
(( ${#archives[@]} )) && echo "gpu_campaign: state $(du -ch "${archives[@]}" | tail -1 | cut -f1) in $DEST/state (${#archives[@]} run archives); batch exit status $status (75 = unfinished)"
# 0 finished, 75 runs left for the next slice; anything else failed.
[[ $status == 0 || $status == 75 ]] && exit 0 || exit "$status"
