"""``rpm-batch --executor slurm`` against a real SLURM: Debian's slurm-wlm (22.05), one node on 127.0.0.1, started
and stopped here (``auth/none``: no munge). A 2-cell grid of tiny runs is submitted as a job array; one cell needs
more than its task's time limit, stops before it with a resumable state, requeues itself and finishes in a
later instance; the tables and metrics equal a local run of the same grid. ``make test-slurm`` runs only these.

Skipped with the install command when the SLURM daemons are absent or the tests do not run as root (slurmd
runs jobs as their user; CI runs as root and ``.ci/run`` installs slurm-wlm).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpm_lib import batch
from rpm_lib.batch import slurm

REPO = Path(__file__).resolve().parents[1]
DAEMONS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: The test cluster's one node; slurmd is told its name (-N), so the machine's own hostname does not matter.
NODE = "rpmnode"


def _slurm_conf(folder: Path) -> str:
    host = socket.gethostname().split(".")[0]  # slurmctld compares its short hostname with SlurmctldHost
    # cred_expire also sets how long SLURM holds a requeued job back (120 s by default); sched_interval how often
    # it looks again. Both are lowered so a requeue takes seconds here, not minutes.
    return f"""ClusterName=rpmtest
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=30
MinJobAge=3600
InactiveLimit=0
JobRequeue=1
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running one-node SLURM; yields the environment (``SLURM_CONF``) its commands need."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"SLURM not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm "
                    "(.ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("the one-node SLURM of these tests runs its daemons as root; run them as root (CI does)")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(_slurm_conf(folder))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    commands = (["slurmctld", "-D", "-f", str(conf)], ["slurmd", "-D", "-N", NODE, "-f", str(conf)])
    daemons = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for command in commands]
    _CONTROLLER.update(command=commands[0], env=env, daemons=daemons)
    try:
        for _ in range(60):
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            log = (folder / "slurmctld.log").read_text()[-2000:] if (folder / "slurmctld.log").exists() else ""
            pytest.fail(f"the test SLURM did not become idle (sinfo: {state!r}); slurmctld.log ends:\n{log}")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()


#: How the cluster's controller is started, and every daemon started (for :func:`_restart_controller`).
_CONTROLLER: dict = {}


def _restart_controller(down_s: float) -> None:
    """Stop slurmctld, wait ``down_s`` seconds, start it again (its state folder keeps the jobs)."""
    controller = _CONTROLLER["daemons"][0]
    controller.terminate()
    controller.wait(timeout=30)
    time.sleep(down_s)
    _CONTROLLER["daemons"][0] = subprocess.Popen(_CONTROLLER["command"], env=_CONTROLLER["env"],
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _batch_yaml(work: Path, out: str, epochs: tuple[int, int] = (2, 60), limits: tuple[int, int] = (1, 40)) -> Path:
    """Two cells: `short` ends within the 1-minute task limit; `long` needs more and is requeued.

    ``limits`` = (time_min, signal_delay_s): (1, 40) leaves each task's run the first 20 s of the task (SLURM's USR2
    and the run's own deadline), start-up included, so `long` (about 50 s of training on a quiet 2-core machine)
    needs several tasks. The requeue test chooses them from a local run of the same cells (:func:`_slurm_limits_for`).
    max_requeues leaves room for a loaded machine.
    """
    path = work / f"{out}.yaml"
    path.write_text(f"""name: slurm-test
template: {REPO / 'notebooks' / '03_train.ipynb'}
out: {work / out}
prepare:
  - creates: {work / 'data' / 'generator.json'}
    run: [rpm-generate, --out, {work / 'data'}, --num-per-config, "10", --seed, "5", --no-xml, --quiet]
slurm:
  time_min: {limits[0]}
  signal_delay_s: {limits[1]}
  cpus_per_task: 1
  max_requeues: 20
fixed:
  data_root: {work / 'data'}
  setup: ce
  encoder: scl
  image_size: 32
  batch_size: 8
  accelerator: cpu
  precision: 32-true
  progress_bar: false
  patience: 100
  resume: true
  save_predictions: true
axes:
  cell:
    short: {{max_epochs: {epochs[0]}}}
    long: {{max_epochs: {epochs[1]}}}
""")
    return path


def _slurm_limits_for(run_dir: Path) -> tuple[int, int]:
    """``(time_min, signal_delay_s)`` under which the run of ``run_dir`` (the long cell, run locally just before on
    this machine) needs two or three tasks, on a fast machine and on a loaded one alike.

    SLURM checks its jobs every 30 s and sends ``--signal``'s USR2 at the first check within the delay plus 30 s of
    the limit (the run's own deadline is the limit less the delay), so a task trains for [limit - delay - 30 s,
    limit - delay] less its start-up (the kernel's, then the training call's up to its first step). Fixed limits
    failed both ways: with 1-minute tasks a loaded machine's start-up took the whole window and the test needed
    dozens of requeues (over 900 s); 2-minute tasks with a 60 s delay did the same when the suite's load made
    start-up 20-40 s (zero steps in 10 tasks in a row). So the delay is chosen for the shortest limit under which
    even a start-up 1.5 times the local one leaves a share of the training per task (a third; less on a fast
    machine), with at least 10 s between the signal and the limit to save the run, and under which the longest
    window, 30 s + start-up / 2 + that share, is under 0.9 times the training, so that the run is requeued."""
    import math

    from rpm_lib.runs.progress import run_progress

    run = run_progress(run_dir)  # one slice: the local run is never interrupted
    start_up = (run.process_s or 0) + (run.first_step_s or 0)
    training = run.seconds - (run.first_step_s or 0)
    share = max(0.1, min(1 / 3, 0.9 - (30 + start_up / 2) / training))
    spare = 30 + 1.5 * start_up + share * training  # what the delay must leave of a task
    minutes = max(1, math.ceil((spare + 10) / 60))
    return minutes, int(60 * minutes - spare)


def _comparable(metrics: dict) -> dict:
    dropped = {"runtime_s", "stages", "git_commit", "config", "test_sets"}
    return {k: v for k, v in metrics.items() if k not in dropped}


def test_a_grid_on_slurm_is_requeued_at_its_time_limit_and_equals_the_local_run(
        slurm_cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    # 90 epochs: about 70 s of training on a quiet 2-core machine, so that 2-minute tasks serve there too
    local_config = _batch_yaml(tmp_path, "local", epochs=(2, 90))
    assert all(r.status == "done" for r in batch.run_batch(local_config, jobs=2, quiet=True))
    limits = _slurm_limits_for(tmp_path / "local" / "main" / "cell-long")
    capsys.readouterr()
    config = _batch_yaml(tmp_path, "on_slurm", epochs=(2, 90), limits=limits)
    results = batch.run_batch(config, executor="slurm", wait=True, quiet=False)
    assert [r.status for r in results] == ["done", "done"], [(r.spec.name, r.status) for r in results]
    printed = capsys.readouterr().out
    # live progress from the shared run folders while the cells train on SLURM: every epoch of the short cell
    for epoch in (1, 2):
        assert f"] main/cell-short supervised epoch {epoch}/2: train loss " in printed, printed
    assert "] main/cell-long supervised epoch 1/90: train loss " in printed, printed
    out = tmp_path / "on_slurm" / "main"
    long_log = (out / "cell-long" / slurm.JOB_LOG).read_text()
    assert "requeued to resume the run" in long_log, (limits, long_log)  # the time limit forced at least one requeue
    assert "(restart 1)" in long_log, long_log
    # (the short cell ends in its first task on an idle machine; under changing load its share of a task may not
    # suffice, so whether it requeued is not asserted: what matters is that both end equal to the local run)
    progress = json.loads((out / "cell-long" / "progress.json").read_text())
    assert len(progress["slices"]) >= 2 and progress["slices"][0]["ended_in"] == "supervised"
    steps = [piece["global_step"]["supervised"] for piece in progress["slices"]]
    assert steps == sorted(steps), f"a requeued task resumed behind where the last one stopped: {steps}"
    statuses = slurm.cell_status(batch.load_batch_config(config), batch.expand_grid(batch.load_batch_config(config)),
                                 tmp_path / "on_slurm")
    assert [s.state for s in statuses] == ["done", "done"] and statuses[1].restarts >= 1, statuses

    for cell in ("cell-short", "cell-long"):
        on_slurm = json.loads((out / cell / "metrics.json").read_text())
        local = json.loads((tmp_path / "local" / "main" / cell / "metrics.json").read_text())
        assert _comparable(on_slurm) == _comparable(local), cell
    table = (tmp_path / "on_slurm" / "table1.csv").read_text()
    assert table == (tmp_path / "local" / "table1.csv").read_text().replace(str(tmp_path / "local"),
                                                                             str(tmp_path / "on_slurm"))


def test_status_and_cancel_name_the_cells_and_bad_settings_fail_in_one_line(
        slurm_cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    config = _batch_yaml(tmp_path, "cancelled")
    assert batch.main([str(config), "--executor", "slurm", "--slurm", "time_min=30"]) == 0
    assert batch.main([str(config), "--executor", "slurm", "--slurm", "time_min=30"]) == 0
    assert "2 run(s) already queued or running, not submitted again" in capsys.readouterr().out
    assert batch.main(["status", str(config)]) == 0
    table = capsys.readouterr().out
    assert "| main/cell-short |" in table and "| main/cell-long |" in table, table
    assert batch.main(["cancel", str(config)]) == 0
    assert "job(s) cancelled" in capsys.readouterr().out
    for _ in range(90):  # a cell whose task had started stops at its next step first (cancelling)
        states = [s.state for s in slurm.cell_status(batch.load_batch_config(config),
                                                      batch.expand_grid(batch.load_batch_config(config)),
                                                      tmp_path / "cancelled")]
        if set(states) <= {"cancelled", "done"}:
            break
        time.sleep(1)
    assert set(states) <= {"cancelled", "done"}, states
    assert batch.main([str(config), "--executor", "slurm", "--slurm", "time_min=0"]) == 2
    assert batch.main([str(config), "--executor", "slurm", "--slurm", "partitoin=gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "slurm setting 'time_min': expected a whole number >= 1, got 0" in err[0]
    assert "unknown slurm setting 'partitoin'" in err[1] and len(err) == 2


def test_without_slurm_the_executor_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # rpm-generate, but no SLURM commands
    monkeypatch.chdir(tmp_path)
    config = _batch_yaml(tmp_path, "nowhere")
    assert batch.main([str(config), "--executor", "slurm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("rpm-batch: error: 'sbatch' not found: --executor slurm needs the SLURM client commands "
                       "(sbatch, squeue, scontrol, scancel) on PATH")


def _epochs_trained(run_dir: Path) -> int:
    history = run_dir / "history.csv"
    return max(0, len(history.read_text().splitlines()) - 1) if history.is_file() else 0


def _until(condition, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not within {seconds:.0f} s: {what}")
        time.sleep(1)


def test_a_cancelled_cell_stops_with_its_state_saved_and_is_never_requeued(
        slurm_cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # both rpm-batch cancel and a user's own scancel used to end in a requeue: the task took SIGTERM for the time
    # limit, stopped at a step and requeued itself, and both cells came back running
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    path = _batch_yaml(tmp_path, "cancel", epochs=(60, 60))
    assert batch.main([str(path), "--executor", "slurm", "--slurm", "time_min=30"]) == 0
    config = batch.load_batch_config(path)
    specs = batch.expand_grid(config)
    out = tmp_path / "cancel"
    cells = {spec.name: out / "main" / spec.name for spec in specs}
    _until(lambda: all(_epochs_trained(run_dir) >= 1 for run_dir in cells.values()), 300, "both cells train")
    long_spec = next(spec for spec in specs if spec.name == "cell-long")
    job = json.loads((cells["cell-long"] / slurm.JOB_RECORD).read_text())["job_id"]
    subprocess.run(["scancel", job], check=True, capture_output=True)
    slurm.wait(config, [long_spec], out, poll_s=1, log=lambda line: None)
    assert batch.main(["cancel", str(path)]) == 0
    assert "1 job(s) cancelled" in capsys.readouterr().out
    statuses = slurm.wait(config, specs, out, poll_s=1, log=lambda line: None)
    assert [s.state for s in statuses] == ["cancelled", "cancelled"], statuses
    for name, by in (("cell-short", "rpm-batch cancel"), ("cell-long", "scancel")):
        log = (cells[name] / slurm.JOB_LOG).read_text()
        assert f"{slurm.CANCEL_LINE} ({by};" in log, log
        assert slurm.REQUEUE_LINE not in log, log
        progress = json.loads((cells[name] / "progress.json").read_text())
        assert progress["status"] == "unfinished" and progress["stages"]["supervised"]["global_step"] > 0, progress
    time.sleep(5)  # a requeued task would be listed again by now
    jobs = [json.loads((run_dir / slurm.JOB_RECORD).read_text())["job_id"] for run_dir in cells.values()]
    listed = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%T"], capture_output=True,
                            text=True).stdout.split()
    assert not set(listed) & {"PENDING", "RUNNING", "REQUEUED"}, listed
    assert "submitting again resumes it" in slurm.status_table(statuses)

    # the resume points lost meanwhile: submitting again refuses to train the stage again from step 0 (it used to,
    # without a word, while progress.json read as if the run had gone on)
    for run_dir in cells.values():
        (run_dir / "checkpoints" / "supervised" / "last.ckpt").unlink()
    results = batch.run_batch(path, executor="slurm", wait=True, quiet=True, slurm={"time_min": 30})
    assert [r.status for r in results] == ["failed", "failed"], results
    for run_dir in cells.values():
        error = (run_dir / "error.txt").read_text().rstrip().splitlines()[-1]
        assert "last.ckpt is missing" in error and "restart_stage=true" in error, error


def test_waiting_rides_out_a_controller_restart(slurm_cluster: dict[str, str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # `--wait` used to exit 2 on the first squeue that could not reach the controller; the grid went on alone
    import threading

    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    path = _batch_yaml(tmp_path, "outage", epochs=(2, 3))

    def outage() -> None:
        # Once a task's Python has started (submitit's first log line): a task that is RUNNING in squeue may still be
        # at srun's check of its allocation, which fails while the controller is down (a test that failed the task,
        # not the wait).
        for _ in range(300):
            if any("Starting with" in log.read_text() for log in (tmp_path / "outage" / "slurm").glob("*/*_log.out")):
                _restart_controller(down_s=15)
                return
            time.sleep(1)

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    results = batch.run_batch(path, executor="slurm", wait=True, quiet=False, slurm={"time_min": 30})
    thread.join(timeout=120)
    assert [r.status for r in results] == ["done", "done"], [(r.spec.name, r.status) for r in results]
    printed = capsys.readouterr().out
    assert printed.count("SLURM's controller unreachable") == 1, printed[-3000:]
    assert "SLURM's controller answers again" in printed, printed[-3000:]


def test_two_submissions_at_once_make_one_array(slurm_cluster: dict[str, str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # two at once created two arrays in 2 of 5 tries; slurm.json kept only the later one
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    path = _batch_yaml(tmp_path, "twice", epochs=(60, 60))
    assert batch.main([str(path), "--prepare-only"]) == 0
    command = [sys.executable, "-m", "rpm_lib.batch", str(path), "--executor", "slurm", "--slurm", "time_min=30"]
    started = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for _ in range(2)]
    printed = [process.communicate(timeout=300)[0] for process in started]
    try:
        listed = subprocess.run(["squeue", "-h", "-r", "-o", "%F|%Z"], capture_output=True, text=True).stdout
        arrays = {line.split("|")[0] for line in listed.splitlines() if line.endswith(f"|{tmp_path}")}
        assert len(arrays) == 1, (listed, printed)
        assert sum("submitted 2 run(s) as job array" in text for text in printed) == 1, printed
        other = next(text for text in printed if "submitted 2 run(s)" not in text)
        assert ("another rpm-batch --executor slurm (submitting)" in other
                or "2 run(s) already queued or running" in other), other
        for name in ("cell-short", "cell-long"):
            record = json.loads((tmp_path / "twice" / "main" / name / slurm.JOB_RECORD).read_text())
            assert record["job_ids"] == [record["job_id"]] and record["job_id"].split("_")[0] in arrays, record
    finally:
        assert batch.main(["cancel", str(path)]) == 0
        config = batch.load_batch_config(path)
        slurm.wait(config, batch.expand_grid(config), tmp_path / "twice", poll_s=1, log=lambda line: None)
