#!/usr/bin/env bash
# One lent-GPU device call of at most 10 minutes: first a Table 1 campaign slice (bench/gpu_campaign.sh), then, in
# the minutes left, bench/profile_training.py on the campaign's own data (where a training step's time goes).
#
#   run: bash bench/gpu_session.sh      (carry .device from `make device-wheels`; timeout_s 600)
#   here: python bench/campaign_record.py <files_at>; the profile and the logs are in <files_at>/extras.tar.gz
#
# $OUT gets at most 8 files back: the campaign's state (1-2 parts), progress.md/json, table1.md, slice.json,
# gpu_util.csv, and extras.tar.gz (campaign.log, profile.log, profile/profile.json, profile/trace_lightning.json.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
STARTED=$(date +%s)
OUT=${OUT:-/tmp/session-out}
mkdir -p "$OUT" /tmp/session-extras
export NO_ALBUMENTATIONS_UPDATE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
source bench/device_env.sh
# The whole call must end before the device tool's 600 s: the campaign gets SESSION_CAMPAIGN_SECONDS, the profile
# what is left of SESSION_SECONDS.
SESSION_SECONDS=${SESSION_SECONDS:-585}
export CAMPAIGN_SECONDS=${SESSION_CAMPAIGN_SECONDS:-430} OUT
bash bench/gpu_campaign.sh 2>&1 | tee /tmp/session-extras/campaign.log | grep -v "^\s*$" | tail -40
left=$(( SESSION_SECONDS - ($(date +%s) - STARTED) - 10 ))
echo "gpu_session: profile with ${left} s left"
if (( left > 45 )) && [[ -f data/i-raven-80/manifest.json ]]; then
    # SESSION_PROFILE: the profile's options; by default the compiled encoder and fused vs per-parameter Adam
    # beside the eager step (case a), the Lightning fit with 40 validation batches (c) and the GPU busy fraction (d).
    # shellcheck disable=SC2086
    timeout "$left" "$PY" bench/profile_training.py ${SESSION_PROFILE:---steps 100 --warmup 10 --val-batches 40 --compile --cases a,c,d} \
        --out /tmp/session-extras/profile \
        data_root=data/i-raven-80 encoder=scl setup=ce_aux_sparse batch_size=128 image_size=80 num_workers=14 \
        progress_bar=false 2>&1 | tee /tmp/session-extras/profile.log | tail -60
    rm -rf /tmp/session-extras/profile/runs
fi
nvidia-smi >/tmp/session-extras/nvidia-smi.txt 2>&1
tar -czf "$OUT/extras.tar.gz" -C /tmp/session-extras .
ls -la "$OUT"
echo "gpu_session: $(( $(date +%s) - STARTED )) s"
