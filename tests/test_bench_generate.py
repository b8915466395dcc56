"""``bench/bench_generate.py --reference DIR``: another generator and rpm-generate timed side by side in one run,
here against a stand-in for raven-datasets' ``I-RAVEN/main.py`` (its command line, files of its layout)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "bench_generate.py"

FAKE_MAIN = '''
import argparse, json, os, sys
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--num-samples", type=int, default=10000)
parser.add_argument("--save-dir", required=True)
parser.add_argument("--seed", type=int, default=-1)
{mesh}
args = parser.parse_args()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
for key in ("center_single", "distribute_four", "distribute_nine", "left_center_single_right_center_single",
            "up_center_single_down_center_single", "in_center_single_out_center_single",
            "in_distribute_four_out_center_single"):
    os.makedirs(os.path.join(args.save_dir, key), exist_ok=True)
    for k in range(args.num_samples):
        np.savez(os.path.join(args.save_dir, key, f"RAVEN_{{k}}_train.npz"), target=np.int64(0))
'''


def _fake_reference(folder: Path, mesh: bool) -> Path:
    script = folder / "I-RAVEN" / "main.py"
    script.parent.mkdir(parents=True)
    flag = 'parser.add_argument("--mesh", type=int, default=0)' if mesh else ""
    script.write_text(FAKE_MAIN.format(mesh=flag))
    return folder


def _bench(*args: str, log: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAKE_LOG": str(log)}
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=600)


def test_the_reference_and_rpm_lib_run_side_by_side_for_plain_and_mesh(tmp_path: Path) -> None:
    reference = _fake_reference(tmp_path / "raven-datasets", mesh=True)
    log = tmp_path / "calls.jsonl"
    done = _bench("--reference", str(reference), "--reference-per-config", "2", "--reference-rounds", "2",
                  "--tmp", str(tmp_path), log=log)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # two rounds for each kind, each with the same problem count and seed as rpm-generate's
    assert len(calls) == 4 and all(call[call.index("--num-samples") + 1] == "2" for call in calls), calls
    assert all(call[call.index("--seed") + 1] == "1234" for call in calls), calls
    assert sum(call[-2:] == ["--mesh", "2"] for call in calls) == 2, calls
    table = [line for line in done.stdout.splitlines() if line.startswith("| I-RAVEN")]
    assert [line.split("|")[1].strip() for line in table] == ["I-RAVEN", "I-RAVEN-Mesh"], done.stdout
    for line in table:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        assert cells[1] == "14" and cells[-1].endswith("x") and float(cells[-1][:-1]) > 0, line
    # only the side-by-side part ran: no single-process table, no regime table
    assert "## rpm-generate speed" not in done.stdout and "## Regimes" not in done.stdout


def test_a_reference_without_mesh_is_compared_on_plain_i_raven_only(tmp_path: Path) -> None:
    reference = _fake_reference(tmp_path / "original", mesh=False)
    log = tmp_path / "calls.jsonl"
    done = _bench("--reference", str(reference), "--reference-per-config", "1", "--reference-rounds", "1",
                  "--tmp", str(tmp_path), log=log)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(log.read_text().splitlines()) == 1
    assert "| I-RAVEN | 7 |" in done.stdout and "I-RAVEN-Mesh not compared" in done.stdout, done.stdout


def test_a_folder_without_a_generator_is_refused(tmp_path: Path) -> None:
    done = _bench("--reference", str(tmp_path), "--tmp", str(tmp_path), log=tmp_path / "calls.jsonl")
    assert done.returncode != 0 and "no I-RAVEN/main.py, src/main.py or main.py" in done.stderr


def test_a_raven_fair_checkout_is_compared_as_raven_and_raven_fair(tmp_path: Path) -> None:
    """RAVEN_FAIR's ``src/main.py`` knows ``--fair``: without it, it writes RAVEN (into <save-dir>/RAVEN-F with it)."""
    script = tmp_path / "RAVEN_FAIR" / "src" / "main.py"
    script.parent.mkdir(parents=True)
    script.write_text(FAKE_MAIN.format(mesh='parser.add_argument("--fair", type=int, default=0)'))
    log = tmp_path / "calls.jsonl"
    done = _bench("--reference", str(script.parents[1]), "--reference-per-config", "1", "--reference-rounds", "1",
                  "--tmp", str(tmp_path), log=log)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 and calls[0][-2:] != ["--fair", "1"] and calls[1][-2:] == ["--fair", "1"], calls
    kinds = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| RAVEN")]
    assert kinds == ["RAVEN", "RAVEN-FAIR"], done.stdout
    only = _bench("--reference", str(script.parents[1]), "--reference-per-config", "1", "--reference-rounds", "1",
                  "--reference-kinds", "RAVEN-FAIR", "--tmp", str(tmp_path), log=log)
    assert only.returncode == 0 and [line.split("|")[1].strip() for line in only.stdout.splitlines()
                                     if line.startswith("| RAVEN")] == ["RAVEN-FAIR"], only.stdout
    wrong = _bench("--reference", str(script.parents[1]), "--reference-kinds", "I-RAVEN-Mesh", "--tmp", str(tmp_path),
                   log=log)
    assert wrong.returncode != 0 and "--reference-kinds: I-RAVEN-Mesh not made by" in wrong.stderr
