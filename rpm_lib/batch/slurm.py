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
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rpm_lib.batch.cell import run_dir_of, run_one
from rpm_lib.batch.config import BatchConfig, BatchConfigError, RunSpec, SlurmSettings, check_settings, job_settings
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.json_files import printable, read_object, read_object_or_empty, shown_value, write_object
from rpm_lib.run_folder import ERROR, STOP_FILE, RunStatus, is_finished, request_stop, stopped_by_budget
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
#: The ``slurm.log`` line of a cell whose job was cancelled (not requeued).
CANCEL_LINE = "cancelled: the run stopped with its state saved; not requeued"
#: What SLURM's commands print when its controller cannot be reached (a restart, a network blip): retried.
CONTROLLER_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
                          "Connection timed out", "Unexpected message received", "Zero Bytes were transmitted",
                          "Transport endpoint is not connected", "backup controller in standby mode")
#: How long ``rpm-batch status`` and ``cancel`` retry an unreachable controller before they give up (seconds).
STATUS_PATIENCE_S = 60.0
#: The longest pause between two tries while the controller is unreachable (seconds).
RETRY_MAX_PAUSE_S = 30.0
#: The submission lock of a batch folder: one ``rpm-batch --executor slurm`` at a time submits its cells.
SUBMIT_LOCK = ".rpm-batch-submit.lock"


class SlurmError(RuntimeError):
    """SLURM is missing or refused a command; the message says which and what it printed."""


class ControllerUnreachable(SlurmError):
    """SLURM's controller did not answer (:data:`CONTROLLER_UNREACHABLE`); trying again later may succeed."""


def _require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SlurmError(f"'{command}' not found: --executor slurm needs the SLURM client commands (sbatch, squeue, "
                         "scontrol, scancel) on PATH")
    return path


def _run(command: list[str]) -> str:
    _require(command[0])
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


def _patiently(call: Any, patience_s: float | None, log: Any) -> Any:
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
        job = _job_id()
        restarts = _restarts()
        received: list[str] = []

        def on_signal(signum: int, frame: Any) -> None:
            # The run (in its notebook kernel) sees the file at its next step and stops with a resumable state.
            request_stop(run_dir)
            received.append(signal.Signals(signum).name)
            _log(run_dir, f"job {job}: {received[-1]} received; asked the run to stop")

        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, on_signal)
        whole = self.settings.time_min * 60
        end = started + whole - self.settings.signal_delay_s
        _log(run_dir, f"job {job}: start on {socket.gethostname()} (restart {restarts}), run budget until "
                      f"{time.strftime('%H:%M:%S', time.localtime(end))}")
        threads = self.settings.cpus_per_task
        with held_from_the_kernel() as arrived:
            result = run_one(spec, self.config, self.out, threads=threads, deadline=(end, whole))
        for name in arrived:
            _log(run_dir, f"job {job}: {name} received during the run (the run's own process took it)")
        if not (run_dir / STOP_FILE).is_symlink():  # a planted link is never followed, also not to delete
            (run_dir / STOP_FILE).unlink(missing_ok=True)
        _log(run_dir, f"job {job}: {result.status} after {time.time() - started:.0f} s")
        if result.status == RunStatus.FAILED:
            raise RuntimeError(f"{run_dir}: the run failed; see {run_dir / ERROR}")
        if result.status == RunStatus.UNFINISHED or stopped_by_budget(run_dir):
            by = _cancelled_by(run_dir, job, "SIGTERM" in received)
            if by is not None:
                _log(run_dir, f"job {job}: {CANCEL_LINE} ({by}; submitting the batch again resumes it)")
                return RunStatus.UNFINISHED
            if restarts >= self.settings.max_requeues:
                _log(run_dir, f"job {job}: not requeued: {restarts} restarts reached max_requeues")
                return RunStatus.UNFINISHED
            _log(run_dir, f"job {job}: {REQUEUE_LINE}")  # before: SLURM may end this instance at once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # SLURM ends this instance now: let it
            try:  # until shortly before the time limit, which would end this task anyway
                patience = max(0.0, started + whole - time.time() - 10)
                _patiently(lambda: _run(["scontrol", "requeue", job]), patience, lambda line: _log(run_dir, line))
            except SlurmError as error:
                # the run's state is saved: the cell is unfinished and resumable, not failed
                _log(run_dir, f"job {job}: requeue failed: {error}; the run is unfinished and resumable (submit the "
                              "batch again)")
                return RunStatus.UNFINISHED
            time.sleep(REQUEUE_WAIT_S)  # returning first would let submitit mark the task completed
        return RunStatus.FINISHED if is_finished(run_dir) else result.status


def _cancelled_by(run_dir: Path, job: str, terminated: bool) -> str | None:
    """Who cancelled this cell's job, or None: ``rpm-batch cancel`` (the run's ``slurm.json`` says so, written before
    its ``scancel``) or a user's ``scancel`` (SIGTERM arrived, and SLURM wrote its cancel line for the job without a
    reason, :func:`_cancelled_by_user`; preemption and the time limit give theirs)."""
    record = _job_record(run_dir) or {}
    if record.get("cancelled"):
        return record.get("cancelled_by") if isinstance(record.get("cancelled_by"), str) else "rpm-batch cancel"
    if terminated and _cancelled_by_user():
        write_object(run_dir / JOB_RECORD, {**record, "cancelled": True, "cancelled_by": "scancel"},
                     indent=1)  # status shows it
        return "scancel"
    return None


#: The line SLURM's step daemon writes into a job's standard error when it ends the job: ``*** JOB 12 ON node1
#: CANCELLED AT 2026-11-28T10:00:00 ***`` for ``scancel``, with `` DUE TO TIME LIMIT``, `` DUE TO PREEMPTION``,
#: `` DUE TO NODE FAILURE`` ... before the closing stars otherwise.
_CANCEL_NOTICE = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+( DUE TO [^*]*)? \*\*\*")


def _cancelled_by_user() -> bool:
    """Whether SLURM is ending this task because a user cancelled its job: the job's state is no help here (SLURM
    shows ``COMPLETING`` until every process of the job has ended), so this reads the cancel line SLURM wrote into
    the task's standard error (submitit's ``<job>_<task>_log.err``, its last 64 KB)."""
    try:
        from submitit import JobEnvironment

        path = Path(JobEnvironment().paths.stderr)
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - (64 << 10)))
            tail = handle.read().decode(errors="replace")
    except (OSError, KeyError, RuntimeError):  # not in a submitit task, or its log unreadable
        return False
    notices = _CANCEL_NOTICE.findall(tail)
    return bool(notices) and not notices[-1]


def _restarts() -> int:
    """How often SLURM has requeued this task."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def _job_id() -> str:
    """This task's id as scontrol knows it: ``<array job>_<task>`` in an array, else the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "?")


def _log(run_dir: Path, line: str) -> None:
    """One dated line in the run's ``slurm.log``; on stderr (submitit's log of the task) as well when the file cannot
    take it (a full disk), so that no line is lost."""
    text = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n"
    try:
        with (run_dir / JOB_LOG).open("a") as handle:
            handle.write(text)
    except OSError as problem:
        print(f"{text.rstrip()} ({JOB_LOG} not written: {problem})", file=sys.stderr, flush=True)


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
    _require("sbatch")
    check_partition(settings, str(config.path))
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_writer(out / SUBMIT_LOCK, "rpm-batch --executor slurm (submitting)", out):
        todo = [s for s in specs if not is_finished(run_dir_of(out, s))]
        recorded = {s.name: job_ids_of(_job_record(run_dir_of(out, s)) or {}) for s in todo}
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


def job_ids_of(record: dict[str, Any]) -> list[str]:
    """Every job id a run's ``slurm.json`` names, oldest first (``job_ids``; a record written before it kept every
    id has ``job_id`` alone)."""
    jobs = [job for job in record.get("job_ids", []) if isinstance(job, str)]
    latest = record.get("job_id")
    return jobs + [latest] if isinstance(latest, str) and latest not in jobs else jobs


def partition_limits(partition: str | None) -> tuple[int, int, int] | None:
    """The most CPUs, memory (MB) and GPUs one node of ``partition`` (None: the default one) has, from ``sinfo``;
    None when ``sinfo`` cannot say (its answer is checked again by SLURM itself at submission)."""
    command = ["sinfo", "-h", "-e", "-o", "%c|%m|%G"] + (["-p", partition] if partition else [])
    try:
        output = _run(command)
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
    output = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(sorted(set(job_ids)))])
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
    records = {spec.name: _job_record(run_dir_of(out, spec)) or {} for spec in specs}
    damage = {spec.name: _job_record_damage(run_dir_of(out, spec)) for spec in specs}
    every_job = [job for record in records.values() for job in job_ids_of(record)]
    active = _patiently(lambda: squeue_states(every_job), patience_s, log) if every_job else {}
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


#: The fields of ``slurm.json`` that status and cancel read, with their types.
_JOB_RECORD_FIELDS: dict[str, type] = {"job_id": str, "job_ids": list, "cancelled": bool}


def _job_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``slurm.json`` (None when it has none, or it is unreadable, too large or deep, or names its job
    other than as text: a shared folder's record must not crash ``status`` or ``cancel``, which ask
    :func:`_job_record_damage` why)."""
    return read_object_or_empty(run_dir / JOB_RECORD, fields=_JOB_RECORD_FIELDS) or None


def _job_record_damage(run_dir: Path) -> str | None:
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
    records = {spec.name: _job_record(run_dir_of(out, spec)) for spec in specs}
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
        _run(["scancel", *jobs])
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
