"""`bench/linear_eval_probe.py`: the linear-evaluation probe of MLCL pre-training checkpoints.

The fast tests check its scorers on synthetic features; the slow one builds a tiny MLCL+AUG run with step
snapshots (the ``pretrain`` sub-command) in tmp_path and probes it end to end on the CPU.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "linear_eval_probe.py"


def _module():
    spec = importlib.util.spec_from_file_location("linear_eval_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Config:
    adam_beta1, adam_beta2, adam_eps, weight_decay = 0.9, 0.999, 1e-8, 0.0


def _synthetic(num: int, dim: int, signal: float, seed: int) -> dict[str, torch.Tensor]:
    """Problems whose correct completion is shifted along one direction (plus a shared per-problem offset)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(num, 8, dim, generator=g) + 5 * torch.randn(num, 1, dim, generator=g)
    target = torch.randint(0, 8, (num,), generator=g)
    direction = torch.zeros(dim)
    direction[0] = 1.0
    h[torch.arange(num), target] += signal * direction
    return {"h": h, "target": target}


def test_lbfgs_is_scale_invariant_and_finds_a_planted_direction() -> None:
    probe = _module()
    train, val = _synthetic(400, 16, 3.0, 0), _synthetic(200, 16, 3.0, 1)
    fit = probe.fit_lbfgs(train, val, "h", l2=1e-3, max_iter=200)
    assert fit["grad_norm"] < 1e-5
    assert fit["val_accuracy"] > 0.8  # the planted direction is found (chance is 12.5 %)
    scaled = probe.fit_lbfgs({**train, "h": 100 * train["h"]}, {**val, "h": 100 * val["h"]}, "h", 1e-3, 200)
    assert scaled["val_accuracy"] == pytest.approx(fit["val_accuracy"], abs=1e-9)
    assert scaled["weight_norm"] == pytest.approx(fit["weight_norm"] / 100, rel=1e-3)


def test_adam_grid_reports_every_budget_and_restores_the_lowest_val_loss() -> None:
    probe = _module()
    train, val = _synthetic(256, 16, 3.0, 2), _synthetic(128, 16, 3.0, 3)
    runs = probe.fit_adam(train, val, "h", [2e-2, 2e-5], [5, 40], batch_size=32, init_seed=7, order_seed=0,
                          config=_Config())
    assert [(r["lr"], r["steps"]) for r in runs] == [(2e-2, 5), (2e-2, 40), (2e-5, 5), (2e-5, 40)]
    for r in runs:
        assert r["restored"]["val_loss"] <= r["last"]["val_loss"] + 1e-12
        assert r["restored"]["step"] <= r["steps"]
    by = {(r["lr"], r["steps"]): r for r in runs}
    # a usable lr learns the planted direction; a tiny one barely moves from the initial head
    assert by[(2e-2, 40)]["last"]["val_accuracy"] > by[(2e-5, 40)]["last"]["val_accuracy"] + 0.3


def test_effective_rank_and_feature_stats() -> None:
    probe = _module()
    g = torch.Generator().manual_seed(0)
    iso = torch.randn(4000, 32, generator=g, dtype=torch.float64)
    assert probe.effective_rank(iso) > 28
    assert probe.effective_rank(torch.randn(4000, 1, generator=g) * torch.randn(1, 32, generator=g)) < 1.5
    data = _synthetic(64, 8, 2.0, 4)
    stats = probe.feature_stats(data["h"], data["target"])
    assert -1 <= stats["cos_correct_own_wrong"] <= 1
    assert 0 < stats["within_problem_variance_fraction"] < 1
    assert stats["effective_rank_all"] <= stats["dim"]


@pytest.mark.slow
def test_tiny_run_is_probed_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_ALBUMENTATIONS_UPDATE": "1"}
    run = tmp_path / "run"
    pretrain = subprocess.run(
        [sys.executable, str(SCRIPT), "pretrain", "--snapshot-steps", "10,30", "setup=mlcl_aug", "encoder=scl",
         "generate=true", f"data_root={tmp_path / 'data'}", "generate_num_per_config=20", "image_size=32",
         "batch_size=8", "max_epochs=3", "linear_eval_epochs=1", "progress_bar=false", "accelerator=cpu",
         "save_predictions=false", f"run_dir={run}"],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert pretrain.returncode == 0, pretrain.stdout[-2000:] + pretrain.stderr[-2000:]
    stage_dir = run / "checkpoints" / "pretrain"
    assert {p.name for p in stage_dir.glob("*.ckpt")} == {"best.ckpt", "last.ckpt", "step-0000010.ckpt",
                                                          "step-0000030.ckpt"}

    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "probe", str(run), "--checkpoints", "step-0000010,step-0000030",
         "--steps", "20,80", "--lrs", "2e-3,2e-4", "--bn-batches", "4", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "LBFGS" in done.stdout and "[step-0000030]" in done.stdout
    report = json.loads(out.read_text())
    (entry,) = report["runs"]
    assert entry["setup"] == "mlcl_aug" and entry["num_train"] == 84 and entry["num_val"] == 28
    assert [r["stage"] for r in entry["history"]][:1] == ["pretrain"]
    checkpoints = entry["checkpoints"]
    assert list(checkpoints) == ["step-0000010", "step-0000030"]
    assert [c["global_step"] for c in checkpoints.values()] == [10, 30]
    for ck in checkpoints.values():
        assert len(ck["bn_shift_recomputed_vs_stored"]) == 4  # SCL's four conv BatchNorms
        assert set(ck["features"]) == {"stored/h", "stored/h_l2", "stored/z", "stored/z_l2", "recomputed/h",
                                       "batch/h"}
        for name, f in ck["features"].items():
            stats = f["stats_train"]
            assert stats["dim"] == (400 if name.endswith("/h") or name.endswith("h_l2") else 128)
            if name.endswith("_l2"):
                assert stats["norm_mean"] == pytest.approx(1.0, abs=1e-4)
            lbfgs = f["lbfgs"]
            # Fitted: its 300 iterations end at the iteration cap, on nearly separable toy features, where what is
            # left of the gradient differs from one CPU to the next (an absolute 1e-4 held on one machine and not on
            # the next: 1.5e-4); judged against the gradient at the start (here it fell by 2e2 to 2e4 times).
            assert lbfgs["grad_norm"] < 1e-2 * lbfgs["grad_norm_start"], (name, lbfgs)
            assert lbfgs["objective"] < math.log(8), (name, lbfgs)  # below the zero scorer's cross-entropy
            # full-batch L-BFGS on the training objective fits the training problems at least as well as Adam
            best_adam = max(a["last"]["train_accuracy"] for a in f["adam"])
            assert lbfgs["train_accuracy"] >= best_adam, (name, lbfgs["train_accuracy"], best_adam)
        grid = ck["features"]["stored/h"]["adam"]
        assert sorted((a["lr"], a["steps"]) for a in grid) == [(2e-4, 20), (2e-4, 80), (2e-3, 20), (2e-3, 80)]
        assert {"mean_difference", "lda", "knn", "mlp"} <= set(ck["features"]["stored/h"])
