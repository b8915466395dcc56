"""``rpm-batch CONFIG --executor slurm``: a grid's cells as one SLURM job array, through submitit.

Every unfinished cell of the selected grids becomes one task of a job array (``submitit.SlurmExecutor``); the
task runs the cell exactly as the local executor does (:func:`rpm_lib.batch.cell.run_one`: the template notebook,
then the ``then`` notebooks) in the folder ``rpm-batch`` was started from. Settings come from the batch YAML's
``slurm:`` mapping and ``--slurm KEY=VALUE`` (:class:`rpm_lib.batch.config.SlurmSettings`).

Time limits and preemption. A task gives its run ``time_budget`` = its time limit less ``signal_delay_s``, so
the run stops at a step boundary with a resumable state before SLURM's signal. If SLURM signals anyway (the
``--signal`` sent ``signal_delay_s`` before the limit, or SIGTERM on preemption), the task writes the run's
``stop.request`` file and the run stops at its next step. An unfinished cell then requeues its own task
(``scontrol requeue``; SLURM starts a requeued job after a delay, about two minutes on a default setup) and the
restarted task resumes the run; after ``max_requeues`` restarts it gives up and the cell stays unfinished. A finished
or failed run is never requeued. Why not submitit's own requeue (a checkpointable callable): docs/cluster.md.

Records, per run folder: ``slurm.json`` (job id, submission time, log folder) and ``slurm.log`` (one line per
start, end and requeue of the task); submitit's own stdout / stderr per task are under ``<out>/slurm/<job id>/``.
``rpm-batch status CONFIG`` combines them with ``squeue``; ``rpm-batch cancel CONFIG`` runs ``scancel``.
submitit (the ``cluster`` extra) is imported inside functions.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpm_lib.batch.cell import run_dir_of, run_one
from rpm_lib.batch.config import BatchConfig, RunSpec, SlurmSettings, check_settings, job_settings
from rpm_lib.json_files import read_object_or_empty, write_object
from rpm_lib.run_folder import ERROR, STOP_FILE, RunStatus, is_finished, stopped_by_budget
from rpm_lib.training.stop_signals import held_from_the_kernel

#: Per-run record of the job that runs it.
JOB_RECORD = "slurm.json"
#: Per-run log of the job's starts, ends and requeues.
JOB_LOG = "slurm.log"
#: The ``slurm.log`` line of a requeue (``rpm-batch status`` counts them).
REQUEUE_LINE = "requeued to resume the run"
#: squeue states shown as they are (everything a job can be in while SLURM still lists it).
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")
#: Seconds a task that requeued itself waits for SLURM to end it: returning first would let submitit mark the task
#: completed.
REQUEUE_WAIT_S = 300


class SlurmError(RuntimeError):
    """SLURM is missing or refused a command; the message says which and what it printed."""


def _require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SlurmError(f"'{command}' not found: --executor slurm needs the SLURM client commands (sbatch, squeue, "
                         "scontrol, scancel) on PATH")
    return path


def _run(command: list[str]) -> str:
    _require(command[0])
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(command[:2])} failed: {message[-1] if message else f'exit {done.returncode}'}")
    return done.stdout


# ----------------------------------------------------------------------------------------------
# the task
# ----------------------------------------------------------------------------------------------
class GridCell:
    """The callable every task of the array runs (pickled by submitit): one grid cell, resumed where it stopped.

    Args:
        config: the batch.
        out: the batch folder.
        settings: the array's settings (time limit, signal delay, requeues).
        cwd: the folder ``rpm-batch`` ran in (relative paths of the YAML and of the notebooks).
    """

    def __init__(self, config: BatchConfig, out: Path, settings: SlurmSettings, cwd: Path) -> None:
        self.config = config
        self.out = out
        self.settings = settings
        self.cwd = cwd

    def __call__(self, spec: RunSpec) -> str:
        os.chdir(self.cwd)
        started = time.time()
        run_dir = run_dir_of(self.out, spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        stop_file = run_dir / STOP_FILE
        job = _job_id()
        restarts = _restarts()

        def request_stop(signum: int, frame: Any) -> None:
            # The run (in its notebook kernel) sees the file at its next step and stops with a resumable state.
            stop_file.touch()
            _log(run_dir, f"job {job}: {signal.Signals(signum).name} received; asked the run to stop")

        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, request_stop)
        whole = self.settings.time_min * 60
        end = started + whole - self.settings.signal_delay_s
        _log(run_dir, f"job {job}: start on {socket.gethostname()} (restart {restarts}), run budget until "
                      f"{time.strftime('%H:%M:%S', time.localtime(end))}")
        threads = self.settings.cpus_per_task
        with held_from_the_kernel() as arrived:
            result = run_one(spec, self.config, self.out, threads=threads, deadline=(end, whole))
        for name in arrived:
            _log(run_dir, f"job {job}: {name} received during the run (the run's own process took it)")
        stop_file.unlink(missing_ok=True)
        _log(run_dir, f"job {job}: {result.status} after {time.time() - started:.0f} s")
        if result.status == RunStatus.FAILED:
            raise RuntimeError(f"{run_dir}: the run failed; see {run_dir / ERROR}")
        if result.status == RunStatus.UNFINISHED or stopped_by_budget(run_dir):
            if restarts >= self.settings.max_requeues:
                _log(run_dir, f"job {job}: not requeued: {restarts} restarts reached max_requeues")
                return RunStatus.UNFINISHED
            _log(run_dir, f"job {job}: {REQUEUE_LINE}")  # before: SLURM may end this instance at once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # SLURM ends this instance now: let it
            try:
                _run(["scontrol", "requeue", job])
            except SlurmError as error:
                _log(run_dir, f"job {job}: requeue failed: {error}")
                raise
            time.sleep(REQUEUE_WAIT_S)  # returning first would let submitit mark the task completed
        return RunStatus.FINISHED if is_finished(run_dir) else result.status


def _restarts() -> int:
    """How often SLURM has requeued this task."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def _job_id() -> str:
    """This task's id as scontrol knows it: ``<array job>_<task>`` in an array, else the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "?")


def _log(run_dir: Path, line: str) -> None:
    with (run_dir / JOB_LOG).open("a") as handle:
        handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


# ----------------------------------------------------------------------------------------------
# submitting, status, cancelling
# ----------------------------------------------------------------------------------------------
def sbatch_parameters(config: BatchConfig, out: Path, settings: SlurmSettings) -> dict[str, Any]:
    """submitit's ``update_parameters`` for the array: what its job script's ``#SBATCH`` lines say. Every value
    from the YAML or ``--slurm`` in them is checked first (:func:`rpm_lib.batch.config.job_settings`: one line, no
    control characters, in range), so none can end its line and start a shell command; ``setup`` is shell by design.

    Raises:
        BatchConfigError: a value that cannot go into the job script, naming its setting.
    """
    settings = check_settings(settings, source=str(config.path))
    job_settings(dataclasses.replace(config, slurm=None), out)  # the job's name and log folder
    parameters: dict[str, Any] = dict(
        time=settings.time_min, cpus_per_task=settings.cpus_per_task, ntasks_per_node=1, nodes=1,
        signal_delay_s=settings.signal_delay_s, array_parallelism=settings.array_parallelism,
        job_name=f"rpm-{config.name}", additional_parameters={"requeue": True, **settings.extra},
        setup=list(settings.setup))
    if settings.partition:
        parameters["partition"] = settings.partition
    if settings.account:
        parameters["account"] = settings.account
    if settings.gpus_per_task:
        parameters["gpus_per_node"] = settings.gpus_per_task
    if settings.mem_gb is not None:
        parameters["mem"] = f"{math.ceil(settings.mem_gb * 1024)}MB"  # at least 1 MB: --mem=0 is the whole node
    return parameters


def submit(config: BatchConfig, specs: Sequence[RunSpec], out: Path, settings: SlurmSettings,
           log: Any = print) -> list[tuple[RunSpec, str]]:
    """Submit the cells without ``metrics.json`` as one job array; returns (cell, job id) pairs.

    Raises:
        SlurmError: SLURM's commands are missing or sbatch refused the array.
        BatchConfigError: a setting that cannot go into the job script (:func:`sbatch_parameters`).
    """
    import submitit

    parameters = sbatch_parameters(config, out, settings)  # a value that cannot go into the job script: refused now
    _require("sbatch")
    todo = [s for s in specs if not is_finished(run_dir_of(out, s))]
    recorded = {s.name: (_job_record(run_dir_of(out, s)) or {}).get("job_id") for s in todo}
    active = squeue_states([job for job in recorded.values() if job])
    queued = [s for s in todo if active.get(recorded[s.name] or "") in ACTIVE_STATES]
    if queued:  # submitting again would train the same run folder twice at once
        log(f"rpm-batch: {len(queued)} run(s) already queued or running, not submitted again: "
            f"{', '.join(s.name for s in queued)}")
        todo = [s for s in todo if s not in queued]
    if not todo:
        log("rpm-batch: every run is finished or already queued; nothing to submit")
        return []
    folder = (out / "slurm" / "%j").resolve()
    # rpm_lib.slurm_start: the task ignores SLURM's SIGUSR2 until a handler is there (an early one killed it)
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=settings.max_requeues,
                                      python=f"{shlex.quote(sys.executable)} -m rpm_lib.slurm_start")
    executor.update_parameters(**parameters)
    cell = GridCell(config, out.resolve(), settings, Path.cwd())
    try:
        jobs = executor.map_array(cell, todo)
    except Exception as error:  # noqa: BLE001 - submitit raises plain errors with sbatch's output inside
        lines = str(error).strip().splitlines()
        raise SlurmError(f"sbatch refused the array: {lines[-1] if lines else type(error).__name__}") from None
    submitted = time.strftime("%Y-%m-%dT%H:%M:%S")
    pairs = []
    for spec, job in zip(todo, jobs):
        run_dir = run_dir_of(out, spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_object(run_dir / JOB_RECORD, {"job_id": job.job_id, "submitted": submitted,
                                            "logs": str(folder).replace("%j", job.job_id)}, indent=1)
        pairs.append((spec, job.job_id))
    log(f"rpm-batch: submitted {len(pairs)} run(s) as job array {jobs[0].job_id.split('_')[0]} "
        f"({settings.time_min} min each, {settings.cpus_per_task} CPUs, {settings.gpus_per_task} GPUs); "
        f"`rpm-batch status {config.path}` shows them")
    return pairs


@dataclasses.dataclass(frozen=True)
class CellStatus:
    """One cell's standing: ``state`` is a :class:`~rpm_lib.run_folder.RunStatus` (done, failed, unfinished,
    cancelled, requeued, not submitted) or SLURM's state in lower case (pending, running, ...); ``restarts`` counts
    the task's requeues (``slurm.log``)."""

    run: str
    state: RunStatus | str
    job_id: str | None
    restarts: int


def squeue_states(job_ids: Sequence[str]) -> dict[str, str]:
    """SLURM's state of each listed job id that SLURM still knows (array tasks as ``<array>_<task>``)."""
    if not job_ids:
        return {}
    output = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(sorted(set(job_ids)))])
    states = {}
    for line in output.splitlines():
        job, _, state = line.strip().partition("|")
        states[job] = state
    return states


def cell_status(config: BatchConfig, specs: Sequence[RunSpec], out: Path) -> list[CellStatus]:
    """Where every cell stands: its files first (done, failed), then SLURM for the rest."""
    records: dict[str, str | None] = {}
    cancelled: set[str] = set()
    for spec in specs:
        record = _job_record(run_dir_of(out, spec))
        if record is not None:
            records[spec.name] = record.get("job_id")
            if record.get("cancelled"):
                cancelled.add(spec.name)
    active = squeue_states([j for j in records.values() if j]) if any(records.values()) else {}
    statuses = []
    for spec in specs:
        run_dir = run_dir_of(out, spec)
        job = records.get(spec.name)
        log = (run_dir / JOB_LOG).read_text() if (run_dir / JOB_LOG).is_file() else ""
        restarts = log.count(REQUEUE_LINE)
        slurm_state = active.get(job or "", "")
        if is_finished(run_dir):
            state = RunStatus.DONE
        elif spec.name in cancelled and slurm_state not in ("RUNNING", "COMPLETING"):
            state = RunStatus.CANCELLED
        elif slurm_state in ACTIVE_STATES:
            state = RunStatus.REQUEUED if slurm_state == "PENDING" and restarts else slurm_state.lower()
        elif (run_dir / ERROR).is_file() or slurm_state in ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                                            "CANCELLED", "BOOT_FAIL", "DEADLINE"):
            state = RunStatus.FAILED if slurm_state != "CANCELLED" else RunStatus.CANCELLED
        elif log.rstrip().endswith(REQUEUE_LINE):
            state = RunStatus.REQUEUED  # asked for; SLURM may list the task under no state for a moment meanwhile
        elif job is None:
            state = RunStatus.NOT_SUBMITTED
        else:
            state = RunStatus.UNFINISHED if stopped_by_budget(run_dir) else (slurm_state.lower() or "unknown")
        statuses.append(CellStatus(f"{spec.grid}/{spec.name}", state, job, restarts))
    return statuses


def _job_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``slurm.json`` (None when it has none, or it is unreadable, too large or deep, or names its job
    other than as text: a shared folder's record must not crash ``status`` or ``cancel``)."""
    return read_object_or_empty(run_dir / JOB_RECORD, fields={"job_id": str, "cancelled": bool}) or None


def status_table(statuses: Sequence[CellStatus]) -> str:
    """``rpm-batch status``: one Markdown table row per cell."""
    lines = ["| run | state | job | requeues |", "|---|---|---|---:|"]
    lines += [f"| {s.run} | {s.state} | {s.job_id or ''} | {s.restarts} |" for s in statuses]
    return "\n".join(lines)


def cancel(config: BatchConfig, specs: Sequence[RunSpec], out: Path) -> list[str]:
    """``scancel`` every cell's job that SLURM still lists; returns the job ids cancelled."""
    statuses = cell_status(config, specs, out)
    ended = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.UNFINISHED, "completed")
    jobs = [s.job_id for s in statuses if s.job_id and s.state not in ended]
    if jobs:
        _run(["scancel", *jobs])
    for spec in specs:  # SLURM may forget a cancelled task at once (a pending array); the run folder remembers
        run_dir = run_dir_of(out, spec)
        record = _job_record(run_dir)
        if record is not None and record.get("job_id") in jobs:
            write_object(run_dir / JOB_RECORD, {**record, "cancelled": True}, indent=1)
    return jobs


def wait(config: BatchConfig, specs: Sequence[RunSpec], out: Path, poll_s: float = 5.0,
         log: Any = print) -> list[CellStatus]:
    """Poll until no cell is pending, running or requeued; returns the final statuses."""
    busy = {"pending", "running", RunStatus.REQUEUED, "configuring", "completing", "suspended", "requeue_hold",
            "signaling", "stage_out"}
    previous = None
    while True:
        statuses = cell_status(config, specs, out)
        summary = ", ".join(f"{s.run.split('/')[-1]}: {s.state}" for s in statuses)
        if summary != previous:
            log(f"rpm-batch: {summary}")
            previous = summary
        if not any(s.state in busy for s in statuses):
            return statuses
        time.sleep(poll_s)
