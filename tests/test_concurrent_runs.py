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
    # the two runs began their measured training together (the start barrier), and the window they shared is known
    starts = [json.loads((tmp_path / f"n2_run{i}.json").read_text())["timeline"][0][0] for i in range(2)]
    assert abs(starts[0] - starts[1]) < 1.0, starts
    assert all(r["window_s"] > 0 and r["window_rpms_per_s"] > 0 for r in rows), rows


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_concurrent_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_common_window_counts_only_the_time_all_runs_trained() -> None:
    window = _bench_module().common_window
    # A trains 10 RPMs/s from t=0 to 10, B 5 RPMs/s from t=2 to 12: together from 2 to 10, 80 + 40 problems in 8 s
    assert window([[[0, 0], [10, 100]], [[2, 0], [12, 50]]]) == (8, 15.0)
    # a run that paused (its validation) trained nothing meanwhile: the window counts the pause
    assert window([[[0, 0], [4, 40], [6, 40], [10, 80]]]) == (10, 8.0)
    # no overlap, or a run without a timeline (an earlier version's script): no window
    assert window([[[0, 0], [1, 10]], [[2, 0], [3, 10]]]) is None
    assert window([[[0, 0], [1, 10]], None]) is None and window([]) is None


def test_the_gpu_utilisation_of_the_window_pools_every_runs_samples_inside_it() -> None:
    bench = _bench_module()
    timelines = [[[0, 0], [10, 100]], [[2, 0], [12, 50]]]  # together from 2 to 10
    bounds = bench.window_bounds(timelines)
    assert bounds == (2, 10)
    # start-up (t=1) and the end (t=11) stay out; both runs' samples inside count
    samples = [[[1, 0], [3, 80], [9, 90], [11, 0]], [[4, 100], [12, 0]]]
    assert bench.window_utilisation(samples, bounds) == 90.0
    assert bench.window_utilisation([None, []], bounds) is None and bench.window_utilisation(samples, None) is None
    assert bench._utilisation_cell(90.0, 61.0) == "90 (61)" and bench._utilisation_cell(None, 49.0) == "(49)"
    assert bench._utilisation_cell(None, None) == ""


def test_bad_arguments_are_a_usage_error(tmp_path: Path) -> None:
    for args in (["--runs", "0", "--cpu-dry-run"], ["--runs", "1,,x", "--cpu-dry-run"], [],
                 ["--data", str(tmp_path / "missing")]):
        done = _run([*args, "--out", str(tmp_path / "out")], timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and "error:" in done.stderr.strip().splitlines()[-1], done.stderr


def _version_tree(root: Path, knows_loader_workers: bool) -> Path:
    """A copy of this checkout's ``rpm_lib`` and ``bench`` standing in for an earlier version; without
    ``knows_loader_workers`` its device check lacks ``--loader-workers``, as ce69914's does."""
    import shutil

    tree = root / "earlier"
    shutil.copytree(REPO / "rpm_lib", tree / "rpm_lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    if not knows_loader_workers:
        check = tree / "bench" / "device_check.py"
        text = check.read_text()
        line = next(x for x in text.splitlines() if '"--loader-workers"' in x)
        text = text.replace(line + "\n", "").replace("args.loader_workers", "None")
        assert "--loader-workers" not in text
        check.write_text(text)
    (tree / "REVISION").write_text("abc1234\n")
    return tree


def test_an_earlier_version_trains_first_in_the_same_call_and_the_ratios_are_against_it(tmp_path: Path) -> None:
    tree = _version_tree(tmp_path, knows_loader_workers=False)
    done = _run(["--cpu-dry-run", "--train-budget", "3", "--runs", "1", "--baseline-code", str(tree),
                 "--out", str(tmp_path / "out")], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "out" / "concurrent_runs.json").read_text())["rows"]
    assert [(r["code"], r["runs"]) for r in rows] == [("abc1234", 1), ("this version", 1)]
    assert rows[0]["loader_workers_per_run"] is None and rows[1]["loader_workers_per_run"] == 0
    assert all(r["aggregate_rpms_per_s"] > 0 for r in rows)
    # the earlier version's run wrote its own report, apart from this version's
    assert (tmp_path / "out" / "baseline_run0.json").is_file() and (tmp_path / "out" / "n1_run0.json").is_file()
    table = (tmp_path / "out" / "concurrent_runs.md").read_text()
    assert "| vs abc1234 |" in table and "| abc1234 | 1 | its default |" in table
    ratio = rows[1]["aggregate_rpms_per_s"] / rows[0]["aggregate_rpms_per_s"]
    assert f"| {ratio:.2f}x |" in table.splitlines()[-1]


def test_an_earlier_version_whose_rpm_lib_cannot_be_imported_is_refused(tmp_path: Path) -> None:
    tree = _version_tree(tmp_path, knows_loader_workers=True)
    (tree / "rpm_lib" / "__init__.py").write_text("raise ImportError('this tree is broken')\n")
    done = _run(["--cpu-dry-run", "--baseline-code", str(tree), "--out", str(tmp_path / "out")], timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "--baseline-code" in last and "importing its rpm_lib fails: ImportError: this tree is broken" in last
    assert str(tree) in last, last
    bare = tmp_path / "bare"
    bare.mkdir()
    done = _run(["--cpu-dry-run", "--baseline-code", str(bare), "--out", str(tmp_path / "out")], timeout=120)
    assert done.returncode == 2 and "holds no bench/device_check.py" in done.stderr.strip().splitlines()[-1]
