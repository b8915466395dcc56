"""The task every cell of ``rpm-batch --executor slurm`` runs on a node (:class:`GridCell`, pickled by submitit): the
cell's notebooks through :func:`rpm_lib.batch.cell.run_one`, stop requests on SLURM's signals, its own requeue when
the run stopped unfinished, and none when the job was cancelled (:func:`cancelled_by`). See
:mod:`rpm_lib.batch.slurm` for the whole mechanism.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

from rpm_lib.batch.cell import run_dir_of, run_one
from rpm_lib.batch.config import BatchConfig, RunSpec, SlurmSettings
from rpm_lib.batch.slurm_client import (CANCEL_LINE, JOB_RECORD, REQUEUE_LINE, SlurmError, job_record, log_line,
                                        patiently, run_command)
from rpm_lib.json_files import write_object
from rpm_lib.run_folder import (ERROR, RunStatus, is_finished, request_stop, stopped_by_budget,
                                withdraw_stop_request)
from rpm_lib.training.stop_signals import held_from_the_kernel

#: Seconds a task that requeued itself waits for SLURM to end it: returning first would let submitit mark the task
#: completed.
REQUEUE_WAIT_S = 300

#: Seconds a task that took SIGTERM waits for SLURM's notice of why (:func:`cancelled_by_user`). The notice and the
#: signal travel separately: on a busy node the run had stopped 4 s after an ``scancel`` and the notice was not yet
#: in the log, so the task requeued itself. SLURM's default KillWait leaves 30 s between SIGTERM and SIGKILL.
NOTICE_WAIT_S = 15.0


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
        job = _job_id()
        restarts = _restarts()
        received: list[str] = []

        def on_signal(signum: int, frame: Any) -> None:
            # The run (in its notebook kernel) sees the file at its next step and stops with a resumable state.
            request_stop(run_dir)
            received.append(signal.Signals(signum).name)
            log_line(run_dir, f"job {job}: {received[-1]} received; asked the run to stop")

        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, on_signal)
        whole = self.settings.time_min * 60
        end = started + whole - self.settings.signal_delay_s
        log_line(run_dir, f"job {job}: start on {socket.gethostname()} (restart {restarts}), run budget until "
                      f"{time.strftime('%H:%M:%S', time.localtime(end))}")
        threads = self.settings.cpus_per_task
        with held_from_the_kernel() as arrived:
            result = run_one(spec, self.config, self.out, threads=threads, deadline=(end, whole))
        for name in arrived:
            log_line(run_dir, f"job {job}: {name} received during the run (the run's own process took it)")
        withdraw_stop_request(run_dir)
        log_line(run_dir, f"job {job}: {result.status} after {time.time() - started:.0f} s")
        if result.status == RunStatus.FAILED:
            raise RuntimeError(f"{run_dir}: the run failed; see {run_dir / ERROR}")
        if result.status == RunStatus.UNFINISHED or stopped_by_budget(run_dir):
            # SLURM's SIGTERM reaches this process too; during the run it is held and taken afterwards (arrived)
            by = cancelled_by(run_dir, job, "SIGTERM" in received or "SIGTERM" in arrived)
            if by is not None:
                log_line(run_dir, f"job {job}: {CANCEL_LINE} ({by}; submitting the batch again resumes it)")
                return RunStatus.UNFINISHED
            if restarts >= self.settings.max_requeues:
                log_line(run_dir, f"job {job}: not requeued: {restarts} restarts reached max_requeues")
                return RunStatus.UNFINISHED
            log_line(run_dir, f"job {job}: {REQUEUE_LINE}")  # before: SLURM may end this instance at once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # SLURM ends this instance now: let it
            try:  # until shortly before the time limit, which would end this task anyway
                patience = max(0.0, started + whole - time.time() - 10)
                patiently(lambda: run_command(["scontrol", "requeue", job]), patience, lambda line: log_line(run_dir, line))
            except SlurmError as error:
                # the run's state is saved: the cell is unfinished and resumable, not failed
                log_line(run_dir, f"job {job}: requeue failed: {error}; the run is unfinished and resumable (submit the "
                              "batch again)")
                return RunStatus.UNFINISHED
            time.sleep(REQUEUE_WAIT_S)  # returning first would let submitit mark the task completed
        return RunStatus.FINISHED if is_finished(run_dir) else result.status


def cancelled_by(run_dir: Path, job: str, terminated: bool) -> str | None:
    """Who cancelled this cell's job, or None: ``rpm-batch cancel`` (the run's ``slurm.json`` says so, written before
    its ``scancel``) or a user's ``scancel`` (SIGTERM arrived, and SLURM wrote its cancel line for the job without a
    reason, :func:`cancelled_by_user`; preemption and the time limit give theirs)."""
    record = job_record(run_dir) or {}
    if record.get("cancelled"):
        return record.get("cancelled_by") if isinstance(record.get("cancelled_by"), str) else "rpm-batch cancel"
    if terminated and cancelled_by_user(wait_s=NOTICE_WAIT_S):
        write_object(run_dir / JOB_RECORD, {**record, "cancelled": True, "cancelled_by": "scancel"},
                     indent=1)  # status shows it
        return "scancel"
    return None


#: The line SLURM's step daemon writes into a job's standard error when it ends the job: ``*** JOB 12 ON node1
#: CANCELLED AT 2026-11-28T10:00:00 ***`` for ``scancel``, with `` DUE TO TIME LIMIT``, `` DUE TO PREEMPTION``,
#: `` DUE TO NODE FAILURE`` ... before the closing stars otherwise.
_CANCEL_NOTICE = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+( DUE TO [^*]*)? \*\*\*")


def cancelled_by_user(wait_s: float = 0.0) -> bool:
    """Whether SLURM is ending this task because a user cancelled its job: the job's state is no help here (SLURM
    shows ``COMPLETING`` until every process of the job has ended), so this reads the cancel line SLURM wrote into
    the task's standard error (submitit's ``<job>_<task>_log.err``, its last 64 KB), waiting up to ``wait_s``
    seconds for a line to arrive."""
    try:
        from submitit import JobEnvironment

        path = Path(JobEnvironment().paths.stderr)
    except (KeyError, RuntimeError):  # not in a submitit task
        return False
    give_up = time.monotonic() + wait_s
    while True:
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - (64 << 10)))
                notices = _CANCEL_NOTICE.findall(handle.read().decode(errors="replace"))
        except OSError:  # the log unreadable
            notices = []
        if notices:
            return not notices[-1]
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.5)


def _restarts() -> int:
    """How often SLURM has requeued this task."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def _job_id() -> str:
    """This task's id as scontrol knows it: ``<array job>_<task>`` in an array, else the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "?")
