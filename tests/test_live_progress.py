"""Live progress (``rpm_lib.runs.live``): a line per finished epoch of every running run, read from the run
folders, ETAs from the measured epochs, and a notice for a run that writes nothing; through ``rpm-batch`` with a
stand-in training notebook (no torch in the kernel) so the batch takes seconds."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import nbformat
import pytest

from rpm_lib import batch
from rpm_lib.runs import live as live_progress
from rpm_lib.runs.live import LiveProgress, duration
from rpm_lib.training.history import HISTORY_COLUMNS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write_history(run_dir: Path, rows: list[dict]) -> None:
    with (run_dir / "history.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=HISTORY_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _row(stage: str, epoch: int, train_loss: float, val_loss: float, val_accuracy: float | str) -> dict:
    return {"stage": stage, "epoch": epoch, "step": 10 * (epoch + 1), "train_loss": train_loss, "val_loss": val_loss,
            "val_accuracy": val_accuracy, "lr": 0.002}


def _two_runs(tmp_path, **watch):
    """Runs main/a (CE, 3 epochs) and main/b (3 pre-training + 2 linear epochs, planned) in tmp_path, and a watcher
    over them with a fake clock; ``watch``: more LiveProgress arguments. Returns (watcher, printed lines, clock)."""
    runs = [("main/a", tmp_path / "a"), ("main/b", tmp_path / "b")]
    for _, folder in runs:
        folder.mkdir()
    lines: list[str] = []
    clock = Clock()
    watcher = LiveProgress(runs, lines.append, stall_s=600, planned={"main/b": {"pretrain": 3, "linear": 2}},
                           clock=clock, **watch)
    return watcher, lines, clock


def _start_run_a(tmp_path):
    a = tmp_path / "a"
    (a / "run.json").write_text("{}")
    (a / "config.yaml").write_text("setup: ce\nmax_epochs: 3\n")
    return a


def _run_a_ends_and_b_pretrains_one_epoch(tmp_path, watcher, clock, now):
    """main/a ends, main/b starts at once and finishes its first pre-training epoch at time ``now``."""
    watcher.ended("main/a")
    b = tmp_path / "b"
    (b / "run.json").write_text("{}")
    watcher.poll()
    clock.now = now
    _write_history(b, [_row("pretrain", 0, 7.5, 7.9, "")])
    watcher.poll()


def test_epoch_lines_carry_stage_epoch_losses_elapsed_and_etas(tmp_path):
    # run b is a 2-stage training (3 pre-training + 2 linear epochs) known before it starts
    watcher, lines, clock = _two_runs(tmp_path)
    watcher.poll()
    assert lines == []  # nothing started
    a = _start_run_a(tmp_path)
    watcher.poll()  # started at t=0
    clock.now = 30.0
    _write_history(a, [_row("supervised", 0, 2.0794, 2.07, 0.125)])
    watcher.poll()
    # one epoch in 30 s, 2 left: 60 s for this run; run b: 5 epochs at 30 s each, one run at a time
    assert lines[0] == ("  [1/2] main/a supervised epoch 1/3: train loss 2.0794, val acc 12.5%, 30 s elapsed, "
                        "ETA run 1m00s, grid 3m30s")
    assert lines[1].startswith("  first epoch measured (30 s): the runs' training should end within about 3m30s")
    clock.now = 50.0
    _write_history(a, [_row("supervised", 0, 2.0794, 2.07, 0.125), _row("supervised", 1, 1.5, 1.6, 0.4)])
    watcher.poll()
    # mean of 30 s and 20 s: 25 s per epoch, 1 epoch left
    assert lines[2] == ("  [1/2] main/a supervised epoch 2/3: train loss 1.5000, val acc 40.0%, 50 s elapsed, "
                        "ETA run 25 s, grid 2m30s")
    # pre-training has no validation accuracy: its validation loss is shown instead
    _run_a_ends_and_b_pretrains_one_epoch(tmp_path, watcher, clock, now=90.0)
    assert lines[3] == ("  [2/2] main/b pretrain epoch 1/3: train loss 7.5000, val loss 7.9000, 40 s elapsed, "
                        "ETA run 2m40s")  # the last run: no grid ETA of its own
    assert len(lines) == 4


def test_a_run_s_eta_runs_from_the_soonest_early_stopping_can_end_it_to_its_epoch_limits(tmp_path):
    # MLCL: 10 pre-training epochs, then at most 10 linear ones; patience 2
    lines: list[str] = []
    clock = Clock()
    run = tmp_path / "m"
    run.mkdir()
    watcher = LiveProgress([("main/m", run)], lines.append, stall_s=600, clock=clock)
    (run / "run.json").write_text("{}")
    (run / "config.yaml").write_text("setup: mlcl\nmax_epochs: 10\npatience: 2\n")
    watcher.poll()
    clock.now = 10.0
    rows = [_row("pretrain", 0, 7.5, 7.0, "")]
    _write_history(run, rows)
    watcher.poll()
    # soonest: 2 more pre-training epochs (patience), then linear evaluation's 1 + 2: 5 x 10 s; at most 9 + 10
    assert lines[0].endswith("ETA run 50 s–3m10s"), lines[0]
    clock.now = 20.0
    rows.append(_row("pretrain", 1, 7.4, 7.2, ""))  # no better: 1 more epoch can end the stage
    _write_history(run, rows)
    watcher.poll()
    assert lines[-1].endswith("ETA run 40 s–3m00s"), lines[-1]
    clock.now = 30.0
    rows.append(_row("pretrain", 2, 7.3, 6.0, ""))  # better: the count starts again
    _write_history(run, rows)
    watcher.poll()
    assert lines[-1].endswith("ETA run 50 s–2m50s"), lines[-1]


def test_a_stage_of_two_views_is_estimated_at_twice_the_cost_per_epoch(tmp_path):
    # run b: MLCL+AUG pre-training (two augmented views per RPM), then a linear stage of one view
    watcher, lines, clock = _two_runs(tmp_path, views={"main/b": {"pretrain": 2, "linear": 1}})
    a = _start_run_a(tmp_path)
    watcher.poll()
    clock.now = 30.0
    _write_history(a, [_row("supervised", 0, 2.0794, 2.07, 0.125)])
    watcher.poll()
    # a: 2 epochs x 30 s left; b: (3 x 2 + 2 x 1) epoch-views x 30 s = 4 min
    assert lines[0].endswith("ETA run 1m00s, grid 5m00s"), lines[0]
    _run_a_ends_and_b_pretrains_one_epoch(tmp_path, watcher, clock, now=70.0)
    # 2 pre-training epochs at the measured 40 s, 2 linear epochs at 40 s / 2 views
    assert lines[-1].endswith("ETA run 2m00s"), lines[-1]


def test_stage_views_follow_the_setup():
    assert live_progress.stage_views({"setup": "mlcl_aug", "max_epochs": 3}) == {"pretrain": 2, "linear": 1}
    assert live_progress.stage_views({"setup": "ce"}) == {"supervised": 1}
    assert live_progress.stage_views({"setup": "no-such-setup"}) is None


def test_a_run_that_writes_nothing_is_reported_once_per_period_and_not_stopped(tmp_path):
    run_dir = tmp_path / "quiet"
    run_dir.mkdir()
    lines: list[str] = []
    clock = Clock()
    watcher = LiveProgress([("main/quiet", run_dir)], lines.append, stall_s=600, clock=clock)
    (run_dir / "run.json").write_text("{}")
    watcher.poll()
    clock.now = 599.0
    watcher.poll()
    assert lines == []
    clock.now = 601.0
    watcher.poll()
    clock.now = 900.0
    watcher.poll()
    assert lines == [f"  [1/1] main/quiet: no progress for 10 min (nothing written to {run_dir}; still running, "
                     "not stopped)"]
    clock.now = 1201.0
    watcher.poll()
    assert lines[-1].startswith("  [1/1] main/quiet: no progress for 20 min") and len(lines) == 2
    (run_dir / "checkpoint.txt").write_text("moved on")  # anything written resets the clock
    watcher.poll()
    clock.now = 1700.0
    watcher.poll()
    assert len(lines) == 2
    clock.now = 1802.0
    watcher.poll()
    assert lines[-1].startswith("  [1/1] main/quiet: no progress for 10 min") and len(lines) == 3


def test_runs_of_an_earlier_call_and_ended_runs_are_not_reported_again(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")  # from an earlier rpm-batch call
    _write_history(run_dir, [_row("supervised", 0, 2.0, 2.0, 0.1)])
    lines: list[str] = []
    clock = Clock()
    watcher = LiveProgress([("main/r", run_dir)], lines.append, stall_s=1, clock=clock)
    clock.now = 100.0
    watcher.poll()
    assert lines == []  # not started in this call: no stall either
    (run_dir / "run.json").write_text('{"again": 1}')  # resumed
    watcher.poll()
    clock.now = 110.0
    _write_history(run_dir, [_row("supervised", 0, 2.0, 2.0, 0.1), _row("supervised", 1, 1.0, 1.0, 0.5)])
    (run_dir / "metrics.json").write_text("{}")  # a cluster's run ends: the folder says so
    watcher.poll()
    assert len(lines) == 1 and "supervised epoch 2:" in lines[0]  # only the new epoch; no limit known
    clock.now = 500.0
    watcher.poll()
    assert len(lines) == 1


def test_duration_format():
    assert [duration(s) for s in (0, 59.4, 60, 125, 3600, 3725)] == ["0 s", "59 s", "1m00s", "2m05s", "1h00m",
                                                                      "1h02m"]


# ------------------------------------------------------------------------------------------------
# through rpm-batch
# ------------------------------------------------------------------------------------------------

FAKE_TRAIN_BODY = """
import csv, json, pathlib, time
run = pathlib.Path(run_dir)
(run / "config.yaml").write_text(f"setup: ce\\nmax_epochs: {epochs}\\n")
time.sleep(quiet_s)
rows = []
for epoch in range(epochs):
    time.sleep(0.3)
    rows.append({"stage": "supervised", "epoch": epoch, "step": epoch + 1, "train_loss": 2.0 - 0.25 * epoch - seed,
                 "val_loss": 2.1 - 0.25 * epoch, "val_accuracy": 0.125 * (epoch + 1), "lr": 0.002})
    with (run / "history.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
(run / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5, "encoder": "scl", "setup": "ce"}))
"""


@pytest.fixture
def fake_training(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell('run_dir: str = ""\noutput_dir: str = ""\nseed: int = 0\nepochs: int = 3\n'
                                          "quiet_s: float = 0.0\n", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(FAKE_TRAIN_BODY)]
    path = tmp_path / "train.ipynb"
    nbformat.write(nb, path)
    return path


def _config(tmp_path: Path, template: Path, fixed: dict) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(f"template: {template}\nout: {tmp_path / 'out'}\nfixed: {json.dumps(fixed)}\naxes: {{seed: [0, 1]}}\n")
    return path


@pytest.mark.parametrize("jobs", [1, 2])
def test_rpm_batch_prints_a_line_per_epoch_of_each_run(tmp_path, fake_training, capsys, monkeypatch, jobs):
    monkeypatch.setattr(live_progress, "POLL_SECONDS", 0.2)
    config = _config(tmp_path, fake_training, {"epochs": 3})
    assert batch.main([str(config), "--jobs", str(jobs)]) == 0
    out = capsys.readouterr().out
    epochs = [line for line in out.splitlines() if " supervised epoch " in line]
    pattern = re.compile(r"  \[(\d)/2\] main/seed-(\d) supervised epoch (\d)/3: train loss (-?\d\.\d{4}), "
                         r"val acc (\d+\.\d)%, (\d+ s|\d+m\d\ds) elapsed, ETA run (\d+ s|\d+m\d\ds)(, grid .*)?$")
    seen = []
    for line in epochs:
        match = pattern.match(line)
        assert match, line
        index, seed, epoch, loss, accuracy, _, _, grid = match.groups()
        if jobs == 1:
            assert (grid is not None) == (seed == "0")  # the grid's ETA while another run is still to come
        assert int(index) == int(seed) + 1
        assert float(loss) == pytest.approx(2.0 - 0.25 * (int(epoch) - 1) - int(seed))
        assert float(accuracy) == pytest.approx(12.5 * int(epoch))
        seen.append((int(seed), int(epoch)))
    expected = [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert (seen if jobs == 1 else sorted(seen)) == expected  # every epoch once (in order, one run at a time)
    assert "no progress" not in out
    if jobs == 2:
        return
    # --quiet: no epoch lines; the start / done lines stay
    config = _config(tmp_path, fake_training, {"epochs": 2})
    for run in (tmp_path / "out" / "main").iterdir():
        (run / "metrics.json").unlink()
    assert batch.main([str(config), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert " epoch " not in out and "[2/2] done" in out


def test_rpm_batch_reports_a_run_that_writes_nothing(tmp_path, fake_training, capsys, monkeypatch):
    monkeypatch.setattr(live_progress, "POLL_SECONDS", 0.2)
    config = _config(tmp_path, fake_training, {"epochs": 1, "quiet_s": 4.0})
    config.write_text(config.read_text().replace("[0, 1]", "[0]"))
    assert batch.main([str(config), "--stall-minutes", "0.02"]) == 0  # 1.2 s
    out = capsys.readouterr().out
    stalls = [line for line in out.splitlines() if "no progress for" in line]
    assert stalls and all(line.startswith("  [1/1] main/seed-0: no progress for ") for line in stalls), out
    assert "still running, not stopped" in stalls[0]
    assert "[1/1] done" in out and (tmp_path / "out" / "main" / "seed-0" / "metrics.json").is_file()


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_bad_stall_time_is_one_line(tmp_path, fake_training, capsys, value):
    with pytest.raises(SystemExit) as stop:
        batch.main([str(_config(tmp_path, fake_training, {})), "--stall-minutes", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rpm-batch: error: --stall-minutes must be a positive number of minutes, got {float(value):g} "
                   "(see rpm-batch --help)"], err


def test_a_run_that_starts_and_ends_between_two_looks_still_gets_its_lines(tmp_path):
    run_dir = tmp_path / "fast"
    run_dir.mkdir()
    lines: list[str] = []
    watcher = LiveProgress([("main/fast", run_dir)], lines.append, clock=Clock())
    (run_dir / "run.json").write_text("{}")
    _write_history(run_dir, [_row("supervised", 0, 2.0, 2.0, 0.1), _row("supervised", 1, 1.0, 1.0, 0.5)])
    watcher.ended("main/fast")
    assert [line.split(":")[0] for line in lines] == ["  [1/1] main/fast supervised epoch 1",
                                                      "  [1/1] main/fast supervised epoch 2"]
    watcher.poll()
    assert len(lines) == 2
