"""SLURM's client commands and the per-run records of ``rpm-batch --executor slurm`` (:mod:`rpm_lib.batch.slurm`):
running ``squeue`` / ``scontrol`` / ``scancel`` with one-line errors, telling an unreachable controller (retried) from
a refusal, and each run folder's ``slurm.json`` (the jobs submitted for it) and ``slurm.log`` (its task's starts,
ends, requeues and cancels). Used by the submitting side (:mod:`rpm_lib.batch.slurm`) and by the task
(:mod:`rpm_lib.batch.slurm_task`).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rpm_lib.json_files import printable, read_object, read_object_or_empty, shown_value

#: Per-run record of the job that runs it.
JOB_RECORD = "slurm.json"
#: Per-run log of the job's starts, ends and requeues.
JOB_LOG = "slurm.log"
#: The ``slurm.log`` line of a requeue (``rpm-batch status`` counts them).
REQUEUE_LINE = "requeued to resume the run"
#: The ``slurm.log`` line of a cell whose job was cancelled (not requeued).
CANCEL_LINE = "cancelled: the run stopped with its state saved; not requeued"
#: What SLURM's commands print when its controller cannot be reached (a restart, a network blip): retried.
CONTROLLER_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
                          "Connection timed out", "Unexpected message received", "Zero Bytes were transmitted",
                          "Transport endpoint is not connected", "backup controller in standby mode")
#: The longest pause between two tries while the controller is unreachable (seconds).
RETRY_MAX_PAUSE_S = 30.0


class SlurmError(RuntimeError):
    """SLURM is missing or refused a command; the message says which and what it printed."""


class ControllerUnreachable(SlurmError):
    """SLURM's controller did not answer (:data:`CONTROLLER_UNREACHABLE`); trying again later may succeed."""


def require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SlurmError(f"'{command}' not found: --executor slurm needs the SLURM client commands (sbatch, squeue, "
                         "scontrol, scancel) on PATH")
    return path


def run_command(command: list[str]) -> str:
    require(command[0])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise ControllerUnreachable(f"{' '.join(command[:2])} failed: no answer within 120 s") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        text = f"{' '.join(command[:2])} failed: {message[-1] if message else f'exit {done.returncode}'}"
        unreachable = any(sign in (done.stderr or "") + (done.stdout or "") for sign in CONTROLLER_UNREACHABLE)
        raise (ControllerUnreachable if unreachable else SlurmError)(text)
    return done.stdout


def patiently(call: Any, patience_s: float | None, log: Any) -> Any:
    """``call()``, tried again with growing pauses (2 s, doubling, at most :data:`RETRY_MAX_PAUSE_S`) while SLURM's
    controller is unreachable: for ``patience_s`` seconds (``None``: until it answers). ``log`` gets one line when
    the controller first fails to answer and one when it answers again.

    Raises:
        ControllerUnreachable: still unreachable after ``patience_s``.
        SlurmError: any other refusal, at once.
    """
    pause, waited, said = 2.0, 0.0, False
    while True:
        try:
            result = call()
        except ControllerUnreachable as error:
            if patience_s is not None and waited >= patience_s:
                raise ControllerUnreachable(f"{error} (SLURM's controller unreachable for {waited:.0f} s)") from None
            if not said:
                log(f"rpm-batch: SLURM's controller unreachable ({error}); retrying")
                said = True
            time.sleep(pause)
            waited += pause
            pause = min(2 * pause, RETRY_MAX_PAUSE_S)
            continue
        if said:
            log(f"rpm-batch: SLURM's controller answers again (after {waited:.0f} s)")
        return result


def log_line(run_dir: Path, line: str) -> None:
    """One dated line in the run's ``slurm.log``; on stderr (submitit's log of the task) as well when the file cannot
    take it (a full disk), so that no line is lost."""
    text = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n"
    try:
        with (run_dir / JOB_LOG).open("a") as handle:
            handle.write(text)
    except OSError as problem:
        print(f"{text.rstrip()} ({JOB_LOG} not written: {problem})", file=sys.stderr, flush=True)


def job_ids_of(record: dict[str, Any]) -> list[str]:
    """Every job id a run's ``slurm.json`` names, oldest first (``job_ids``; a record written before it kept every
    id has ``job_id`` alone)."""
    jobs = [job for job in record.get("job_ids", []) if isinstance(job, str)]
    latest = record.get("job_id")
    return jobs + [latest] if isinstance(latest, str) and latest not in jobs else jobs


#: The fields of ``slurm.json`` that status and cancel read, with their types.
_JOB_RECORD_FIELDS: dict[str, type] = {"job_id": str, "job_ids": list, "cancelled": bool}


def job_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``slurm.json`` (None when it has none, or it is unreadable, too large or deep, or names its job
    other than as text: a shared folder's record must not crash ``status`` or ``cancel``, which ask
    :func:`job_record_damage` why)."""
    return read_object_or_empty(run_dir / JOB_RECORD, fields=_JOB_RECORD_FIELDS) or None


def job_record_damage(run_dir: Path) -> str | None:
    """Why the run's ``slurm.json`` cannot tell the cell's jobs, in one line naming the file: not a JSON object
    (truncated, damaged), a field of another type, no job id at all; None when the run has none or it can."""
    path = run_dir / JOB_RECORD
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        record = read_object(path, ValueError, fields=_JOB_RECORD_FIELDS)
    except OSError as error:  # a folder, a dangling link, no permission
        return printable(f"{path}: unreadable ({error.strerror or type(error).__name__})", 500)
    except ValueError as error:
        return printable(error, 500)
    ids = record.get("job_ids", [])
    wrong = next((job for job in ids if not isinstance(job, str)), None)
    if wrong is not None:
        return printable(f"{path}: field 'job_ids' must list job ids as text, got {shown_value(wrong, 40)}", 500)
    if not job_ids_of(record):
        return printable(f"{path}: names no job id", 500)
    return None
