"""``rpm_lib.batch.slurm`` without a cluster: what ``status`` and ``cancel`` make of a batch folder's records and of
SLURM's answers (its commands replaced by recorded answers), an unreachable controller, a cancelled task, the
partition's limits and a full disk's error line. tests/test_slurm.py runs the same paths against a real SLURM."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rpm_lib import batch
from rpm_lib.batch import cell, slurm, slurm_task
from rpm_lib.batch.config import SlurmSettings
from rpm_lib.run_folder import RunStatus


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(f"""name: states
template: {Path(__file__).resolve().parents[1] / 'notebooks' / '03_train.ipynb'}
out: {tmp_path / 'out'}
fixed: {{setup: ce, encoder: scl}}
axes:
  cell:
    a: {{max_epochs: 1}}
    b: {{max_epochs: 2}}
""")
    return path


class FakeSlurm:
    """SLURM's commands as recorded answers: ``squeue`` lists ``states``; ``scancel`` is recorded; while
    ``down`` > 0 every command fails as an unreachable controller does (and ``down`` counts down)."""

    def __init__(self, states: dict[str, str] | None = None, sinfo: str = "8|64000|gpu:2\n", down: int = 0) -> None:
        self.states = dict(states or {})
        self.sinfo = sinfo
        self.down = down
        self.calls: list[list[str]] = []

    def __call__(self, command: list[str]) -> str:
        self.calls.append(command)
        if self.down > 0:
            self.down -= 1
            raise slurm.ControllerUnreachable(f"{command[0]} failed: slurm_load_jobs error: Unable to contact slurm "
                                              "controller (connect failure)")
        if command[0] == "squeue":
            wanted = command[command.index("-j") + 1].split(",")
            return "".join(f"{job}|{self.states[job]}\n" for job in wanted if job in self.states)
        if command[0] == "sinfo":
            return self.sinfo
        return ""


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeSlurm) -> tuple[Any, list, Path]:
    monkeypatch.setattr(slurm, "run_command", fake)
    monkeypatch.setattr(slurm.time, "sleep", lambda seconds: None)
    config = batch.load_batch_config(_config(tmp_path))
    specs = batch.expand_grid(config)
    return config, specs, tmp_path / "out"


def _record(out: Path, spec: Any, **record: Any) -> Path:
    run_dir = cell.run_dir_of(out, spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / slurm.JOB_RECORD).write_text(json.dumps(record))
    return run_dir


def test_status_sees_every_job_a_cell_was_ever_submitted_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two submissions raced before the lock: the older array still trains cell a while the record's latest id
    # names the newer one, which SLURM already ended
    fake = FakeSlurm({"10_0": "RUNNING", "11_0": "CANCELLED"})
    config, specs, out = _setup(tmp_path, monkeypatch, fake)
    _record(out, specs[0], job_id="11_0", job_ids=["10_0", "11_0"])
    statuses = slurm.cell_status(config, specs, out)
    assert [(s.state, s.job_id) for s in statuses] == [("running", "10_0"), (RunStatus.NOT_SUBMITTED, None)]
    assert "| main/cell-a | running | 10_0 | 0 |" in slurm.status_table(statuses)
    assert slurm.cancel(config, specs, out) == ["10_0"]
    assert ["scancel", "10_0"] in fake.calls
    record = json.loads((cell.run_dir_of(out, specs[0]) / slurm.JOB_RECORD).read_text())
    assert record["cancelled"] is True  # written before scancel: the stopping task reads it and does not requeue
    fake.states["10_0"] = "COMPLETING"
    assert slurm.cell_status(config, specs, out)[0].state == RunStatus.CANCELLING
    fake.states["10_0"] = "CANCELLED"
    status = slurm.cell_status(config, specs, out)[0]
    assert status.state == RunStatus.CANCELLED
    assert "submitting again resumes it" in slurm.status_table([status])


@pytest.mark.parametrize(("content", "why"), [
    ('{"job_id": "10_0", "job_i', "not valid JSON"),  # truncated
    ('{"job_id": 10}', "field 'job_id' must be str, got int 10"),
    ('{"submitted": "2026-11-28T10:00:00"}', "names no job id"),
])
def test_a_damaged_job_record_is_a_damaged_cell_that_cancel_names_not_one_never_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], content: str,
        why: str) -> None:
    # found: shown as "not submitted", and cancel cancelled nothing for it without a word
    fake = FakeSlurm({"10_0": "RUNNING", "10_1": "RUNNING"})
    config, specs, out = _setup(tmp_path, monkeypatch, fake)
    record = _record(out, specs[0], job_id="10_0") / slurm.JOB_RECORD
    record.write_text(content)
    _record(out, specs[1], job_id="10_1")
    statuses = slurm.cell_status(config, specs, out)
    assert [(s.state, s.job_id) for s in statuses] == [(RunStatus.DAMAGED, None), ("running", "10_1")]
    table = slurm.status_table(statuses)
    assert table.splitlines()[0] == "| run | state | job | requeues | next |"
    assert "| main/cell-a | damaged | unknown: slurm.json damaged (below) |" in table
    assert f"- main/cell-a: {record}: {why}" in table
    assert slurm.cancel(config, specs, out) == ["10_1"]  # the other cell's job all the same
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rpm-batch cancel: warning: {record}: {why}") and "cannot tell the job of cell main/cell-a" in line
    assert record.read_text() == content  # not rewritten as if it were a record


def test_a_task_that_ended_without_finishing_its_run_is_unfinished_not_completed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # its requeue failed (the controller was down), or it reached max_requeues: the run is resumable
    config, specs, out = _setup(tmp_path, monkeypatch, FakeSlurm({"7_0": "COMPLETED"}))
    _record(out, specs[0], job_id="7_0")
    _record(out, specs[1], job_id="7_1")  # SLURM has forgotten this one
    assert [s.state for s in slurm.cell_status(config, specs, out)] == [RunStatus.UNFINISHED, RunStatus.UNFINISHED]


def test_an_unreachable_controller_is_waited_out_and_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm({"7_0": "RUNNING", "7_1": "RUNNING"}, down=5)
    config, specs, out = _setup(tmp_path, monkeypatch, fake)
    _record(out, specs[0], job_id="7_0")
    _record(out, specs[1], job_id="7_1")
    lines: list[str] = []
    assert [s.state for s in slurm.cell_status(config, specs, out, patience_s=None, log=lines.append)] == [
        "running", "running"]
    assert len(lines) == 2 and "controller unreachable" in lines[0] and "retrying" in lines[0], lines
    assert "answers again" in lines[1]
    # rpm-batch status gives up after its patience, in one line
    fake.down = 1000
    with pytest.raises(slurm.ControllerUnreachable, match="unreachable for 6[0-9] s"):
        slurm.cell_status(config, specs, out, log=lines.append)
    # a refusal that is not an outage is not retried
    monkeypatch.setattr(slurm, "run_command", lambda command: (_ for _ in ()).throw(slurm.SlurmError("squeue -h failed: "
                                                                                                "Invalid job id")))
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.cell_status(config, specs, out, patience_s=None)


def test_the_controller_s_own_words_for_an_outage_are_told_from_a_refusal(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    script = tmp_path / "squeue"
    script.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)'"
                      " >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.ControllerUnreachable):
        slurm.run_command(["squeue", "-h"])
    script.write_text("#!/bin/sh\necho 'squeue: error: Invalid job id specified' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError) as refused:
        slurm.run_command(["squeue", "-h"])
    assert not isinstance(refused.value, slurm.ControllerUnreachable)


@pytest.mark.parametrize(("notice", "by_user"), [
    ("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-28T10:00:00 ***", True),
    ("slurmstepd: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-11-28T10:00:00 ***", True),
    ("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-28T10:00:00 DUE TO TIME LIMIT ***", False),
    ("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-28T10:00:00 DUE TO PREEMPTION ***", False),
    ("", False),
], ids=["scancel", "scancel-step", "time-limit", "preemption", "none"])
def test_a_user_s_cancel_is_told_from_the_time_limit_and_preemption(
        notice: str, by_user: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _in_a_submitit_task(tmp_path, monkeypatch)
    (folder / "12_0_0_log.err").write_text(f"training...\n{notice}\n")
    monkeypatch.setattr(slurm_task, "NOTICE_WAIT_S", 1.0)
    assert slurm_task.cancelled_by_user() is by_user
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert slurm_task.cancelled_by(run_dir, "12_0", terminated=True) == ("scancel" if by_user else None)
    assert slurm_task.cancelled_by(run_dir, "12_0", terminated=False) == ("scancel" if by_user else None)  # recorded
    (run_dir / slurm.JOB_RECORD).write_text(json.dumps({"job_id": "12_0", "cancelled": True}))
    assert slurm_task.cancelled_by(run_dir, "12_0", terminated=False) == "rpm-batch cancel"


def test_a_cancel_notice_that_arrives_after_the_run_stopped_still_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGTERM and SLURM's notice travel separately: on a busy node the run had stopped before the notice was written,
    # and the task requeued a cancelled job
    import threading

    folder = _in_a_submitit_task(tmp_path, monkeypatch)
    log = folder / "12_0_0_log.err"
    log.write_text("training...\n")
    late = threading.Timer(1.5, lambda: log.write_text(
        "training...\nslurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-28T10:00:00 ***\n"))
    late.start()
    try:
        assert slurm_task.cancelled_by_user() is False  # no waiting asked: not (yet) a cancel
        assert slurm_task.cancelled_by_user(wait_s=30) is True
    finally:
        late.cancel()


def _in_a_submitit_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment submitit's job script gives task 0 of array job 12; returns its log folder."""
    folder = tmp_path / "logs"
    folder.mkdir()
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # what submitit's job script exports
    monkeypatch.setenv("SUBMITIT_FOLDER", str(folder))
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node1")
    return folder


@pytest.mark.parametrize(("setting", "named"), [
    ({"cpus_per_task": 9}, "'cpus_per_task' (9) is more than any node of the default partition has (8 CPUs"),
    ({"mem_gb": 70.0}, "'mem_gb' (70 GB) is more than any node of the default partition has (64000 MB"),
    ({"gpus_per_task": 3, "partition": "gpu"}, "'gpus_per_task' (3) is more than any node of partition 'gpu' has (2"),
])
def test_settings_no_node_can_give_are_refused_before_submitting(setting: dict[str, Any], named: str,
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(sinfo="4|32000|(null)\n8|64000|gpu:a100:2(S:0-1)\n")
    monkeypatch.setattr(slurm, "run_command", fake)
    with pytest.raises(batch.BatchConfigError, match="would wait for ever") as refused:
        slurm.check_partition(SlurmSettings(**setting), "grid.yaml")
    assert named in str(refused.value)
    slurm.check_partition(SlurmSettings(cpus_per_task=8, mem_gb=62.5, gpus_per_task=2), "grid.yaml")
    monkeypatch.setattr(slurm, "run_command", FakeSlurm(down=10))  # sinfo cannot say: sbatch checks it
    slurm.check_partition(SlurmSettings(cpus_per_task=1000), "grid.yaml")


def test_a_time_budget_is_refused_on_slurm_instead_of_dropped(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert batch.main([str(_config(tmp_path)), "--executor", "slurm", "--time-budget", "600", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--time-budget: on SLURM each task's budget is its time limit" in err[0], err


def test_a_full_disk_is_the_last_line_of_error_txt() -> None:
    # PyTorch's own last line for a checkpoint cut short by a full disk; Errno 28 lies further up
    error = RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 123 vs 456")
    error.__context__ = OSError(28, "No space left on device", "/runs/a/checkpoints/supervised/last.ckpt")
    text = cell.describe_error(error)
    assert text.rstrip().splitlines()[-1] == ("OSError: [Errno 28] No space left on device: "
                                              "/runs/a/checkpoints/supervised/last.ckpt")
    plain = cell.describe_error(ValueError("lr must be positive"))
    assert plain.rstrip().splitlines()[-1] == "ValueError: lr must be positive"
