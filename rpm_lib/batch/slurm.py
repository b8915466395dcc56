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

Cancelling is final. ``rpm-batch cancel`` marks the cells cancelled in their ``slurm.json`` before it runs
``scancel``; a task that gets SIGTERM asks SLURM for its job's state, and SLURM marks a job ``CANCELLED`` before it
signals it. Either way the run stops at its next step with its state saved and the task is not requeued (preemption
and the time limit still requeue it). Submitting the batch again resumes a cancelled cell.

SLURM's controller may be unreachable for a while (a restart, a network blip): ``status`` and ``--wait`` retry
``squeue`` with backoff (``--wait`` for as long as it takes, saying so once), and a task whose own requeue fails
leaves its cell unfinished and resumable, never failed. One submission at a time per batch folder (a lock);
``slurm.json`` keeps every job id submitted for its run, so that ``status`` and ``cancel`` see all of them.

Records, per run folder: ``slurm.json`` (job id, submission time, log folder) and ``slurm.log`` (one line per
start, end and requeue of the task); submitit's own stdout / stderr per task are under ``<out>/slurm/<job id>/``.
``rpm-batch status CONFIG`` combines them with ``squeue``; ``rpm-batch cancel CONFIG`` runs ``scancel``.
submitit (the ``cluster`` extra) is imported inside functions.
"""
from __future__ import annotations

import dataclasses
import math
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rpm_lib.batch.cell import run_dir_of
from rpm_lib.batch.config import BatchConfig, BatchConfigError, RunSpec, SlurmSettings, check_settings, job_settings
from rpm_lib.batch.slurm_client import (CANCEL_LINE, JOB_LOG, JOB_RECORD, REQUEUE_LINE, ControllerUnreachable,
                                        SlurmError, job_ids_of, job_record, job_record_damage, patiently, require,
                                        run_command)
from rpm_lib.batch.slurm_task import GridCell
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.json_files import write_object
from rpm_lib.run_folder import ERROR, RunStatus, is_finished

__all__ = ["CANCEL_LINE", "JOB_LOG", "JOB_RECORD", "REQUEUE_LINE", "ControllerUnreachable", "SlurmError", "GridCell",
           "submit", "sbatch_parameters", "partition_limits", "check_partition", "CellStatus", "squeue_states",
           "cell_status", "status_table", "cancel", "wait", "job_ids_of", "job_record", "run_command"]

#: squeue states shown as they are (everything a job can be in while SLURM still lists it).
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")
#: How long ``rpm-batch status`` and ``cancel`` retry an unreachable controller before they give up (seconds).
STATUS_PATIENCE_S = 60.0
#: The submission lock of a batch folder: one ``rpm-batch --executor slurm`` at a time submits its cells.
SUBMIT_LOCK = ".rpm-batch-submit.lock"


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
           log: Any = print, status_hint: str | None = None) -> list[tuple[RunSpec, str]]:
    """Submit the cells without ``metrics.json`` as one job array; returns (cell, job id) pairs.

    One submission at a time per batch folder (:data:`SUBMIT_LOCK`): between the check of what is queued and the
    records of what was submitted, a second ``rpm-batch`` would submit the same cells again. ``status_hint`` is the
    ``rpm-batch status ...`` command printed at the end (default: for the YAML's own ``out``).

    Raises:
        SlurmError: SLURM's commands are missing or sbatch refused the array.
        BatchConfigError: a setting that cannot go into the job script (:func:`sbatch_parameters`), or that no node
            of the partition can give (:func:`check_partition`).
        FolderBusyError: another ``rpm-batch`` is submitting cells of this batch folder.
    """
    import submitit

    parameters = sbatch_parameters(config, out, settings)  # a value that cannot go into the job script: refused now
    require("sbatch")
    check_partition(settings, str(config.path))
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_writer(out / SUBMIT_LOCK, "rpm-batch --executor slurm (submitting)", out):
        todo = [s for s in specs if not is_finished(run_dir_of(out, s))]
        recorded = {s.name: job_ids_of(job_record(run_dir_of(out, s)) or {}) for s in todo}
        active = squeue_states([job for jobs in recorded.values() for job in jobs])
        queued = [s for s in todo if any(active.get(job) in ACTIVE_STATES for job in recorded[s.name])]
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
            # every job ever submitted for this run: an older one SLURM still runs stays visible to status / cancel
            write_object(run_dir / JOB_RECORD, {
                "job_id": job.job_id, "job_ids": [*recorded[spec.name], job.job_id], "submitted": submitted,
                "logs": str(folder).replace("%j", job.job_id)}, indent=1)
            pairs.append((spec, job.job_id))
    hint = status_hint or f"rpm-batch status {config.path}"
    log(f"rpm-batch: submitted {len(pairs)} run(s) as job array {jobs[0].job_id.split('_')[0]} "
        f"({settings.time_min} min each, {settings.cpus_per_task} CPUs, {settings.gpus_per_task} GPUs); "
        f"`{hint}` shows them")
    return pairs


def partition_limits(partition: str | None) -> tuple[int, int, int] | None:
    """The most CPUs, memory (MB) and GPUs one node of ``partition`` (None: the default one) has, from ``sinfo``;
    None when ``sinfo`` cannot say (its answer is checked again by SLURM itself at submission)."""
    command = ["sinfo", "-h", "-e", "-o", "%c|%m|%G"] + (["-p", partition] if partition else [])
    try:
        output = run_command(command)
    except SlurmError:
        return None
    cpus = memory = gpus = -1
    for line in output.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        cpu_text, memory_text, gres = fields
        numbers = [int(n) for n in re.findall(r"\d+", cpu_text)[:1] + re.findall(r"\d+", memory_text)[:1]]
        if len(numbers) != 2:
            continue
        cpus, memory = max(cpus, numbers[0]), max(memory, numbers[1])
        # gres such as "gpu:4", "gpu:a100:8(S:0-1)", "(null)"
        gpus = max(gpus, sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres)))
    return None if cpus < 0 else (cpus, memory, gpus)


def check_partition(settings: SlurmSettings, source: str) -> None:
    """Refuse settings that no node of the partition can give: such a task would stay pending for ever (reason
    ``PartitionConfig`` or ``Resources``).

    Raises:
        BatchConfigError: CPUs, memory or GPUs per task above the largest node's, naming the setting.
    """
    limits = partition_limits(settings.partition)
    if limits is None:
        return
    cpus, memory_mb, gpus = limits
    where = f"partition {settings.partition!r}" if settings.partition else "the default partition"
    if settings.cpus_per_task > cpus:
        raise BatchConfigError(f"{source}: slurm setting 'cpus_per_task' ({settings.cpus_per_task}) is more than any "
                               f"node of {where} has ({cpus} CPUs, sinfo); the task would wait for ever")
    if settings.mem_gb is not None and math.ceil(settings.mem_gb * 1024) > memory_mb:
        raise BatchConfigError(f"{source}: slurm setting 'mem_gb' ({settings.mem_gb:g} GB) is more than any node of "
                               f"{where} has ({memory_mb} MB, sinfo); the task would wait for ever")
    if settings.gpus_per_task > gpus:
        raise BatchConfigError(f"{source}: slurm setting 'gpus_per_task' ({settings.gpus_per_task}) is more than any "
                               f"node of {where} has ({gpus} GPUs, sinfo); the task would wait for ever")


@dataclasses.dataclass(frozen=True)
class CellStatus:
    """One cell's standing: ``state`` is a :class:`~rpm_lib.run_folder.RunStatus` (done, failed, unfinished,
    cancelled, cancelling, requeued, not submitted) or SLURM's state in lower case (pending, running, ...);
    ``restarts`` counts the task's requeues (``slurm.log``); ``job_id`` is the job SLURM runs it in (else the latest
    submitted); ``jobs`` counts the cell's jobs SLURM lists as active (more than one: submitted twice); ``problem``
    says, for a ``damaged`` cell, why its ``slurm.json`` cannot tell its jobs (one line naming the file)."""

    run: str
    state: RunStatus | str
    job_id: str | None
    restarts: int
    jobs: int = 0
    problem: str | None = None


def squeue_states(job_ids: Sequence[str]) -> dict[str, str]:
    """SLURM's state of each listed job id that SLURM still knows (array tasks as ``<array>_<task>``)."""
    if not job_ids:
        return {}
    output = run_command(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(sorted(set(job_ids)))])
    states = {}
    for line in output.splitlines():
        job, _, state = line.strip().partition("|")
        states[job] = state
    return states


#: SLURM states of a job that ended without finishing the run's notebook (a task that fails reports FAILED itself).
_FAILED_STATES = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def cell_status(config: BatchConfig, specs: Sequence[RunSpec], out: Path, patience_s: float | None = STATUS_PATIENCE_S,
                log: Any = print) -> list[CellStatus]:
    """Where every cell stands: its files first (done, failed), then SLURM for the rest, asking SLURM again while
    its controller is unreachable (for ``patience_s`` seconds; None: until it answers)."""
    records = {spec.name: job_record(run_dir_of(out, spec)) or {} for spec in specs}
    damage = {spec.name: job_record_damage(run_dir_of(out, spec)) for spec in specs}
    every_job = [job for record in records.values() for job in job_ids_of(record)]
    active = patiently(lambda: squeue_states(every_job), patience_s, log) if every_job else {}
    statuses = []
    for spec in specs:
        run_dir = run_dir_of(out, spec)
        record = records[spec.name]
        jobs = job_ids_of(record)
        listed = [job for job in jobs if active.get(job) in ACTIVE_STATES]
        # the job SLURM runs the cell in; else the latest submitted
        job = next((j for j in listed if active[j] == "RUNNING"), listed[-1] if listed else (jobs[-1] if jobs else None))
        log_text = (run_dir / JOB_LOG).read_text(errors="replace") if (run_dir / JOB_LOG).is_file() else ""
        restarts = log_text.count(REQUEUE_LINE)
        slurm_state = active.get(job or "", "")
        if is_finished(run_dir):
            state = RunStatus.DONE
        elif damage[spec.name] is not None:
            # Not "not submitted": the cell may well have a job that trains; nothing here can tell which.
            statuses.append(CellStatus(f"{spec.grid}/{spec.name}", RunStatus.DAMAGED, None, restarts,
                                       problem=damage[spec.name]))
            continue
        elif record.get("cancelled"):
            state = RunStatus.CANCELLING if slurm_state in ACTIVE_STATES else RunStatus.CANCELLED
        elif slurm_state in ACTIVE_STATES:
            state = RunStatus.REQUEUED if slurm_state == "PENDING" and restarts else slurm_state.lower()
        elif (run_dir / ERROR).is_file() or slurm_state in _FAILED_STATES:
            state = RunStatus.FAILED
        elif slurm_state == "CANCELLED":
            state = RunStatus.CANCELLED  # SLURM cancelled it (scancel of a pending task, an administrator)
        elif log_text.rstrip().endswith(REQUEUE_LINE):
            state = RunStatus.REQUEUED  # asked for; SLURM may list the task under no state for a moment meanwhile
        elif job is None:
            state = RunStatus.NOT_SUBMITTED
        else:
            # its task ended (COMPLETED, or forgotten) with the run neither finished nor failed: stopped with its
            # state saved (max_requeues reached, its requeue failed) or killed; submitting again resumes it
            state = RunStatus.UNFINISHED
        statuses.append(CellStatus(f"{spec.grid}/{spec.name}", state, job, restarts, len(listed)))
    return statuses


def status_table(statuses: Sequence[CellStatus]) -> str:
    """``rpm-batch status``: one Markdown table row per cell, and what SLURM does next with it."""
    lines = ["| run | state | job | requeues | next |", "|---|---|---|---:|---|"]
    lines += [f"| {s.run} | {s.state} | {_job_cell(s)} | {s.restarts} | {NEXT.get(s.state, '')} |" for s in statuses]
    damaged = [s for s in statuses if s.problem]
    if damaged:
        lines += ["", "Cells whose job cannot be told (a job of theirs may still train; squeue lists it):"]
        lines += [f"- {s.run}: {s.problem}" for s in damaged]
    return "\n".join(lines)


def _job_cell(status: CellStatus) -> str:
    """The job column of a cell's row: its job id (and how many more are active), or the record it cannot be told
    from."""
    if status.problem:
        return f"unknown: {JOB_RECORD} damaged (below)"
    return f"{status.job_id or ''}{f' (+{status.jobs - 1} more)' if status.jobs > 1 else ''}"


#: What happens next to a cell in each state (``rpm-batch status``'s last column).
NEXT = {
    RunStatus.DONE: "nothing: finished",
    RunStatus.FAILED: "nothing: see error.txt; submitting again retries it",
    RunStatus.UNFINISHED: "nothing: submitting again resumes it",
    RunStatus.CANCELLED: "nothing: submitting again resumes it",
    RunStatus.CANCELLING: "stops at its next step with its state saved; not requeued",
    RunStatus.REQUEUED: "SLURM starts it again; it resumes",
    RunStatus.NOT_SUBMITTED: "nothing: not submitted",
    RunStatus.DAMAGED: "unknown: cancel cannot tell its job either",
    "pending": "SLURM starts it when resources free up",
    "running": "trains; requeues itself at its time limit until finished",
}


def cancel(config: BatchConfig, specs: Sequence[RunSpec], out: Path,
           warn: Callable[[str], None] | None = None) -> list[str]:
    """Cancel every cell's jobs that SLURM still lists; returns the job ids cancelled. The cells are marked
    cancelled first, so that a task stopping because of it does not requeue itself.

    A cell whose ``slurm.json`` cannot tell its jobs (``damaged`` in ``status``) is named in one line passed to
    ``warn`` (default: printed on stderr): nothing of it is cancelled, and it must not pass for a cell without jobs.
    """
    statuses = cell_status(config, specs, out)
    records = {spec.name: job_record(run_dir_of(out, spec)) for spec in specs}
    active = squeue_states([job for record in records.values() if record for job in job_ids_of(record)])
    jobs = []
    for spec, status in zip(specs, statuses):
        record = records[spec.name]
        if status.state == RunStatus.DAMAGED:
            (warn or _warn_on_stderr)(f"{status.problem}; cannot tell the job of cell {status.run}, so none of its "
                                      "jobs was cancelled (find it with squeue and scancel it)")
            continue
        if record is None or status.state == RunStatus.DONE:
            continue
        listed = [job for job in job_ids_of(record) if active.get(job) in ACTIVE_STATES]
        if listed:
            write_object(run_dir_of(out, spec) / JOB_RECORD, {**record, "cancelled": True}, indent=1)
            jobs += listed
    if jobs:
        run_command(["scancel", *jobs])
    return jobs


def _warn_on_stderr(line: str) -> None:
    print(f"rpm-batch cancel: warning: {line}", file=sys.stderr)


def wait(config: BatchConfig, specs: Sequence[RunSpec], out: Path, poll_s: float = 5.0,
         log: Any = print) -> list[CellStatus]:
    """Poll until no cell is pending, running, cancelling or requeued; returns the final statuses. An unreachable
    controller is waited out (one line says so)."""
    busy = {"pending", "running", RunStatus.REQUEUED, RunStatus.CANCELLING, "configuring", "completing",
            "suspended", "requeue_hold", "signaling", "stage_out"}
    previous = None
    while True:
        statuses = cell_status(config, specs, out, patience_s=None, log=log)
        summary = ", ".join(f"{s.run.split('/')[-1]}: {s.state}" for s in statuses)
        if summary != previous:
            log(f"rpm-batch: {summary}")
            previous = summary
        if not any(s.state in busy for s in statuses):
            return statuses
        time.sleep(poll_s)
