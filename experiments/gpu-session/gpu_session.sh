#!/usr/bin/env bash
# One 10-minute stay on a time-limited GPU machine: first a Table 1 campaign slice (tools/campaign/gpu_slice.sh), then, in
# the minutes left, experiments/gpu-profile/profile_training.py on the campaign's own data: the training step eager and with its
# whole forward compiled as CUDA graphs, bare and inside Lightning.
#
#   there: SESSION_OUT=DIR bash experiments/gpu-session/gpu_session.sh   (with .gpu from `make gpu-wheels` copied there)
#   here: python tools/campaign/record.py DIR; the profile and the logs are in DIR/extras.tar.gz
#
# SESSION_SECOND=linear-eval puts the linear-evaluation probe (docs/linear-evaluation.md, ~4 min on the
# campaign's data) in the profile's place; give the slice less then: SESSION_CAMPAIGN_SECONDS=300.
# SESSION_SECOND=concurrency measures one training run against two at once, for CE+AUX-sparse and then MLCL+AUG
# (issue 20's two throughput targets), 45 s of training each (SESSION_CONCURRENCY_BUDGET). When .gpu/baseline
# holds the reference version (ce69914: see experiments/README.md), one run of it trains first, for the ratios against it.
# A setup starts only when its rounds fit, ~(budget + 40) s each: with the reference, 3 rounds, ~4.3 min a setup
# (SESSION_CAMPAIGN_SECONDS=300 leaves time for the first); without it 2 rounds (300 leaves time for both).
# SESSION_CUDA_MPS=1 adds, per setup, a round through a private CUDA MPS daemon for each count above one (rpm_lib.cuda_mps),
# where NVIDIA's control program is, and left out for a setup where it would not leave the later setups their rounds.
# SESSION_CONCURRENCY_RUNS (default 1,2): the counts of runs at once compared, one round each.
# SESSION_CAMPAIGN_SECONDS=0 runs no slice; on a fresh machine it makes the campaign's data first (the YAML's prepare
# steps, ~30 s). The whole throughput comparison in one call, both setups, three at once as the campaign trains:
#   SESSION_CAMPAIGN_SECONDS=0 SESSION_SECOND=concurrency SESSION_CUDA_MPS=1 SESSION_CONCURRENCY_BUDGET=30 \
#   SESSION_CONCURRENCY_RUNS=1,3
# (ran on 2026-11-28, one H200, 523 s: docs/reproduction-gpu.md, "Three runs at once, with and without MPS").
#
# SESSION_OUT gets at most 8 files: the campaign's state (1-3 parts), slice.tar.gz (progress.md/json, table1.md,
# slice.json, gpu_util.csv), and extras.tar.gz (campaign.log, nvidia-smi.txt and the second part's files:
# profile_{eager,step_cudagraphs,fp32_tf32}.log and profile_*/profile.json; or linear_eval/pretrain.json, history.csv,
# probe.json, probe.txt; or concurrent_<setup>/concurrent_runs.{md,json}).
set -uo pipefail
for arg in "$@"; do
    case $arg in
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_session: error: unknown argument '$arg' (settings are environment variables: see --help)" >&2
           exit 2 ;;
    esac
done
cd "$(dirname "$0")/../.."
STARTED=$(date +%s)
SESSION_OUT=${SESSION_OUT:-/tmp/session-out}
mkdir -p "$SESSION_OUT" /tmp/session-extras
export NO_ALBUMENTATIONS_UPDATE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
source tools/gpu_env.sh
# The whole stay must end within 600 s: the campaign gets SESSION_CAMPAIGN_SECONDS, the profile
# what is left of SESSION_SECONDS.
SESSION_SECONDS=${SESSION_SECONDS:-585}
export CAMPAIGN_SECONDS=${SESSION_CAMPAIGN_SECONDS:-430} CAMPAIGN_OUT=$SESSION_OUT
if [[ $CAMPAIGN_SECONDS == 0 ]]; then
    echo "gpu_session: no campaign slice (SESSION_CAMPAIGN_SECONDS=0)"
    if [[ ! -f data/i-raven-80/manifest.json ]]; then
        # a fresh machine: the campaign's data, made as its slice would (the YAML's prepare steps)
        made=$(date +%s)
        rpm-batch configs/table1_scl_gpu.yaml --prepare-only 2>&1 | tail -3
        echo "gpu_session: the campaign's data made in $(( $(date +%s) - made )) s"
    fi
else
    bash tools/campaign/gpu_slice.sh 2>&1 | tee /tmp/session-extras/campaign.log | grep -v "^\s*$" | tail -40
fi
left=$(( SESSION_SECONDS - ($(date +%s) - STARTED) - 10 ))
SECOND=${SESSION_SECOND:-profile}
echo "gpu_session: $SECOND with ${left} s left"
if [[ $SECOND == linear-eval ]]; then
    X=/tmp/session-extras/linear_eval
    mkdir -p "$X"
    # MLCL+AUG pre-training with encoder snapshots at 4 and 8 epochs, then the probe over them (the puzzle:
    # 76 % -> 61 % linear evaluation after longer pre-training; how to read probe.txt: docs/linear-evaluation.md).
    # time_budget stops the pre-training cleanly early enough to leave the probe ~150 s for its first checkpoints.
    timeout "$left" "$PY" experiments/linear-eval/linear_eval_probe.py pretrain --snapshot-steps 1312,2624 setup=mlcl_aug encoder=scl \
        time_budget=$(( left > 250 ? left - 150 : 100 )) \
        data_root=data/i-raven-80 image_size=80 batch_size=128 lr=0.002 max_epochs=8 linear_eval_epochs=1 \
        max_val_samples=4000 max_test_samples=2000 num_workers=14 accelerator=gpu devices=1 progress_bar=false \
        save_predictions=false run_dir=/tmp/lep/run >"$X/pretrain.json" 2>"$X/pretrain.log"
    cp /tmp/lep/run/history.csv "$X/" 2>/dev/null
    left=$(( SESSION_SECONDS - ($(date +%s) - STARTED) - 10 ))
    # a pre-training cut short by its time_budget has fewer snapshots: probe the ones that exist
    ck=$(for c in step-0001312 step-0002624 best; do [[ -f /tmp/lep/run/checkpoints/pretrain/$c.ckpt ]] && printf '%s,' $c; done)
    (( left > 20 )) && [[ -n $ck ]] && timeout "$left" "$PY" experiments/linear-eval/linear_eval_probe.py probe /tmp/lep/run \
        --checkpoints "${ck%,}" --num-train 10000 --num-val 4000 --steps 500,1000,3000 \
        --num-workers 8 --out "$X/probe.json" >"$X/probe.txt" 2>&1
    tail -c 4000 "$X/probe.txt" 2>/dev/null
elif [[ $SECOND == concurrency ]]; then
    # per setup, one run against several at once (experiments/concurrency/bench_concurrent_runs.py), side by side in this call; a
    # setup is started only when it can end in time: a round per count of runs (SESSION_CONCURRENCY_RUNS), one for
    # the reference version, each its training plus its start-up (~40 s)
    budget=${SESSION_CONCURRENCY_BUDGET:-45}
    runs=${SESSION_CONCURRENCY_RUNS:-1,2}
    IFS=, read -ra counts <<<"$runs"
    rounds=${#counts[@]} several=0
    for count in "${counts[@]}"; do (( count > 1 )) && several=$(( several + 1 )); done
    baseline=()
    if [[ -f .gpu/baseline/REVISION ]]; then
        baseline=(--baseline-code .gpu/baseline) rounds=$(( rounds + 1 ))
    fi
    # Only where NVIDIA's control program is: the bench refuses --cuda-mps without it, and that refusal would cost the
    # call its other rounds too.
    mps=()
    [[ ${SESSION_CUDA_MPS:-0} == 1 ]] && { "$PY" -c 'from rpm_lib.cuda_mps import find_control; find_control()' \
        2>/dev/null && mps=(--cuda-mps) || echo "gpu_session: no MPS round: nvidia-cuda-mps-control is not on this machine"; }
    setups=(${SESSION_CONCURRENCY_SETUPS:-ce_aux_sparse mlcl_aug})
    unit=$(( budget + 40 )) essential=$(( rounds * unit ))
    for i in "${!setups[@]}"; do
        setup=${setups[$i]}
        left=$(( SESSION_SECONDS - ($(date +%s) - STARTED) - 10 ))
        # an MPS round (the bench adds one for each count of several runs) only where it leaves the later setups
        # their rounds without it: those carry the comparison with the reference version
        later=$(( (${#setups[@]} - i - 1) * essential )) mine=$(( left - later ))
        with=("${mps[@]}") need=$(( (rounds + (${#mps[@]} ? several : 0)) * unit ))
        if (( ${#mps[@]} && mine < need )); then
            (( left >= essential )) && echo "gpu_session: concurrency of $setup without its MPS round: ${mine} s for" \
                "it beside the later setups' rounds, $need needed with it"
            with=() need=$essential
        fi
        if (( left < need )); then
            echo "gpu_session: concurrency of $setup skipped: ${left} s left, $(( need / unit )) rounds need $need"
            break
        fi
        # rounds that run long stop at this setup's share (their rows so far are kept), not the later setups'
        (( mine < need )) && mine=$left
        timeout "$mine" "$PY" experiments/concurrency/bench_concurrent_runs.py --data data/i-raven-80 --setup "$setup" --runs "$runs" \
            "${baseline[@]}" "${with[@]}" --train-budget "$budget" --out "/tmp/session-extras/concurrent_$setup" 2>&1 | tail -14
        find "/tmp/session-extras/concurrent_$setup" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
    done
elif (( left > 45 )) && [[ -f data/i-raven-80/manifest.json ]]; then
    # Two profiles side by side on the campaign's data: the step eager, then with its whole forward compiled and
    # replayed as CUDA graphs (compile=true compile_scope=step compile_mode=reduce-overhead), each as the bare step
    # (case a) and inside Lightning (c). The H100 profile of 2026-11-27 found the compiled encoder 1.47x on the bare
    # step but 0.91x inside Lightning. SESSION_PROFILE replaces the options of both.
    common="data_root=data/i-raven-80 encoder=scl setup=ce_aux_sparse batch_size=128 image_size=80 num_workers=14"
    # Third, when time is left: fp32 with TF32 matmuls, without autocast's casts (experiments/gpu-profile/count_step_ops.py: 83 of a
    # step's 312 kernels).
    for variant in eager step_cudagraphs fp32_tf32; do
        left=$(( SESSION_SECONDS - ($(date +%s) - STARTED) - 10 ))
        (( left > 30 )) || break
        extra=""
        [[ $variant == step_cudagraphs ]] && extra="compile=true compile_scope=step compile_mode=reduce-overhead"
        [[ $variant == fp32_tf32 ]] && extra="precision=32-true matmul_precision=high"
        # shellcheck disable=SC2086
        timeout "$left" "$PY" experiments/gpu-profile/profile_training.py ${SESSION_PROFILE:---steps 60 --warmup 15 --val-batches 20 --cases a,c} \
            --out "/tmp/session-extras/profile_$variant" $common $extra progress_bar=false 2>&1 \
            | tee "/tmp/session-extras/profile_$variant.log" | tail -30
        rm -rf "/tmp/session-extras/profile_$variant/runs"
    done
fi
nvidia-smi >/tmp/session-extras/nvidia-smi.txt 2>&1
tar -czf "$SESSION_OUT/extras.tar.gz" -C /tmp/session-extras .
ls -la "$SESSION_OUT"
echo "gpu_session: $(( $(date +%s) - STARTED )) s"
