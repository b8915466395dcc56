"""`tools/gpu_check.sh --cpu-dry-run`: the GPU check's every part runs here on tiny sizes, so it cannot rot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cpu_dry_run_passes_every_part_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "RPM_GPU_WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu-dry-run", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=900)
    report = json.loads((out / "device_report.json").read_text())
    failed = {name: r.get("output_tail", "")[-800:] for name, r in report["results"].items() if r["status"] != "pass"}
    assert not failed, failed
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = report["results"]
    assert list(results) == ["environment", "gpu_tests", "encoders", "encoders_compiled", "generate_cache",
                             "train_ce_aux_sparse", "train_mlcl_aug", "batch"]
    assert set(results["encoders"]["numbers"]) == {"scl", "copinet", "hrinet", "wren", "predrnet"}
    cache = results["generate_cache"]  # the campaign's recipe: straight into the training cache
    assert "--cache-size" in cache["command"] and cache["numbers"]["problems"] == 70, cache
    train = results["train_mlcl_aug"]["numbers"]
    assert train["views_per_rpm"] == 2 and train["rpms_per_s"] > 0 and 0 <= train["data_wait_fraction"] <= 1
    assert set(train["test_accuracy_per_configuration"]) == {"Center", "2x2Grid", "3x3Grid", "L-R", "U-D", "O-IC",
                                                             "O-IG"}
    assert results["gpu_tests"]["numbers"]["summary"].startswith("2 passed"), results["gpu_tests"]["numbers"]
    assert len(results["batch"]["numbers"]["runs_finished"]) == 1  # the dry run's one-run grid
    assert "| train_mlcl_aug | pass |" in (out / "device_report.md").read_text()


def test_the_utilisation_while_training_leaves_start_up_and_later_stages_out() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    samples = [(0.5, 0), (1.0, 0), (2.0, 80), (3.0, 100), (4.5, 10)]
    # the first stage trained from t=1.5 to t=3.5 (its timeline: (time, RPMs so far) points)
    assert check.utilisation_between(samples, *check._span([(1.5, 0), (2.5, 64), (3.5, 128)])) == 90.0
    assert check.utilisation_between(samples, *check._span([(1.5, 0)])) is None  # no span: no step recorded
    assert check.utilisation_between([], 1.5, 3.5) is None  # a CPU run samples nothing
