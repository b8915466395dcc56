"""`bench/bench_concurrent_runs.py` (one training run against several at once on a GPU) on tiny CPU sizes: both
counts train and report their aggregate, and bad arguments are one usage error, so the GPU measurement cannot rot
between lent-GPU sessions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "bench_concurrent_runs.py"


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"})


def test_dry_run_trains_one_then_two_runs_at_once_and_sums_them(tmp_path: Path) -> None:
    done = _run(["--cpu-dry-run", "--train-budget", "3", "--out", str(tmp_path)], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "concurrent_runs.json").read_text())["rows"]
    assert [r["runs"] for r in rows] == [1, 2] and not any(r["failed"] for r in rows)
    for row in rows:
        assert len(row["rpms_per_s_per_run"]) == row["runs"] and all(x > 0 for x in row["rpms_per_s_per_run"])
        assert row["aggregate_rpms_per_s"] == round(sum(row["rpms_per_s_per_run"]), 1)
    table = (tmp_path / "concurrent_runs.md").read_text()
    assert "| 1 | 0 |" in table and "1.00x" in table and "| 2 | 0 |" in table


def test_bad_arguments_are_a_usage_error(tmp_path: Path) -> None:
    for args in (["--runs", "0", "--cpu-dry-run"], ["--runs", "1,,x", "--cpu-dry-run"], [],
                 ["--data", str(tmp_path / "missing")]):
        done = _run([*args, "--out", str(tmp_path / "out")], timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and "error:" in done.stderr.strip().splitlines()[-1], done.stderr
