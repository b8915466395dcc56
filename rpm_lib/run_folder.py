"""What a run folder is: its file names, its status vocabulary, "finished", and how run folders are found.

A run folder is what ``rpm-train`` (``rpm_lib.training.train``) writes and ``rpm-batch`` fills, one per run::

    config.yaml          the run's TrainConfig
    run.json             the batch cell that made it (rpm-batch only): notebook parameters, template
    progress.json        stages done, their weights, time spent; ``status`` unfinished after a time budget
    history.csv          one row per epoch and stage
    metrics.json         the final evaluation: its presence is what "finished" means
    predictions*.npz     per-sample predictions (optional)
    final_weights.pt     the weights the test scored, in bfloat16, with the config (its SHA-256 in metrics.json)
    checkpoints/<stage>/{last,best}.ckpt
    error.txt            why a batch cell failed (rpm-batch)
    stop.request         asks a training run to stop at its next step with a resumable state
    .rpm-train.lock      held while a process trains in the folder

Every module that reads or writes one of these files takes its name from here. This module imports nothing of
rpm_lib but ``json_files``, so training, reporting and batch code can all depend on it.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpm_lib.json_files import read_object_or_empty, write_object

__all__ = [
    "CONFIG", "RUN_RECORD", "PROGRESS", "HISTORY", "METRICS", "PREDICTIONS", "FINAL_WEIGHTS",
    "EXTRA_PREDICTIONS_GLOB", "PREDICTIONS_GLOB", "CHECKPOINTS", "ERROR", "STOP_FILE", "RUN_LOCK", "RUN_RECORDS",
    "UNFINISHED_EXIT_CODE",
    "RunStatus", "FINISHED", "UNFINISHED", "is_finished", "request_stop", "withdraw_stop_request",
    "stopped_by_budget", "is_run_folder", "RunFolders",
    "find_run_folders", "weights_record", "recorded_weights", "write_object",
]

CONFIG = "config.yaml"
#: The batch cell's record (``rpm-batch``): notebook parameters, template, grid.
RUN_RECORD = "run.json"
PROGRESS = "progress.json"
HISTORY = "history.csv"
#: The final evaluation. A run is finished exactly when this file exists (``is_finished``).
METRICS = "metrics.json"
PREDICTIONS = "predictions.npz"
#: The weights a finished run's test scored, as a bfloat16 ``state_dict`` with the run's config
#: (``rpm_lib.training.final_weights``); ``metrics.json`` records its SHA-256 under ``final_weights``.
FINAL_WEIGHTS = "final_weights.pt"
#: Per-set prediction files of extra test sets (``predictions_<name>.npz``).
EXTRA_PREDICTIONS_GLOB = "predictions_*.npz"
#: Every prediction file of a run.
PREDICTIONS_GLOB = "predictions*.npz"
CHECKPOINTS = "checkpoints"
#: Why a batch cell failed (``rpm-batch``), with the tail of the notebook's error.
ERROR = "error.txt"
#: A file of this name in a run folder asks the run to stop at its next step boundary, as if its time budget had
#: ended (``rpm_lib.training.time_budget``). Written by a signal handler (``rpm_lib.training.stop_signals``), by
#: ``rpm-batch`` on SLURM when the scheduler signals, and by ``rpm-batch --time-budget`` for a run still going
#: after the batch's budget; ``train`` removes a request left from an earlier call.
STOP_FILE = "stop.request"
#: A run folder's write lock (``rpm_lib.folder_lock``), held by the process that trains in it (``train``); an
#: ``rpm-batch unpack --overwrite`` over the folder waits for no one: it is refused while the lock is held.
RUN_LOCK = ".rpm-train.lock"
#: Files that make a folder a run folder: a started or unfinished ``rpm-train`` run has ``config.yaml`` /
#: ``progress.json`` but neither ``run.json`` nor ``metrics.json``.
RUN_RECORDS: tuple[str, ...] = (RUN_RECORD, METRICS, PROGRESS, CONFIG)
#: Exit status of ``rpm-train`` and ``rpm-batch`` when a time budget ended work that a rerun continues:
#: EX_TEMPFAIL of sysexits.h, "try again later".
UNFINISHED_EXIT_CODE = 75


class RunStatus(enum.StrEnum):
    """Every status a run (or a batch cell) is reported with, by every command.

    A ``StrEnum``: members compare equal to, and are written to JSON and tables as, their plain values.
    """

    #: ``metrics.json`` exists (``progress.json``'s ``status`` too).
    FINISHED = "finished"
    #: stopped with a resumable state (a time budget, a signal); a rerun continues it (``progress.json``).
    UNFINISHED = "unfinished"
    #: a batch cell that ran to its end in this call.
    DONE = "done"
    #: a batch cell already finished before this call.
    SKIPPED = "skipped"
    #: a batch cell whose notebook raised (``error.txt``).
    FAILED = "failed"
    #: ``--dry-run``: a batch cell that would run.
    PLANNED = "planned"
    #: a batch cell handed to SLURM.
    SUBMITTED = "submitted"
    #: a run folder with history but neither a result nor a resumable stop: still training, or killed.
    RUNNING_OR_KILLED = "running or killed"
    #: a run folder with a configuration and nothing else yet.
    NOT_STARTED = "not started"
    #: a SLURM cell not submitted yet.
    NOT_SUBMITTED = "not submitted"
    #: a gathered run folder with neither a result nor an error yet.
    PENDING = "pending"
    #: a run folder whose records cannot be read (the report names the file and why).
    DAMAGED = "damaged"
    #: a SLURM cell whose job was cancelled (``rpm-batch cancel`` or ``scancel``); it is not requeued, and submitting
    #: again resumes it.
    CANCELLED = "cancelled"
    #: a SLURM cell cancelled while its task was running: the run is stopping at its next step, with its state saved.
    CANCELLING = "cancelling"
    #: a SLURM cell whose task requeued itself to resume its run (waiting to start again).
    REQUEUED = "requeued"


FINISHED, UNFINISHED = RunStatus.FINISHED, RunStatus.UNFINISHED


def request_stop(run_dir: str | os.PathLike) -> bool:
    """Ask the run training in ``run_dir`` to stop at its next step: create its :data:`STOP_FILE`, never through a
    symbolic link (one planted at that name could lead anywhere) and never blocking on a FIFO. Returns whether the
    request is there; a link, folder or missing run folder there is left as it is (False)."""
    try:
        handle = os.open(Path(run_dir) / STOP_FILE, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError:
        return False
    os.close(handle)
    return True


def withdraw_stop_request(run_dir: str | os.PathLike) -> None:
    """Remove the run's :data:`STOP_FILE` where there is one; a symbolic link planted at that name is left alone."""
    stop_file = Path(run_dir) / STOP_FILE
    if not stop_file.is_symlink():
        stop_file.unlink(missing_ok=True)


def is_finished(run_dir: str | os.PathLike) -> bool:
    """Whether the run in ``run_dir`` is finished: its ``metrics.json`` exists."""
    return (Path(run_dir) / METRICS).is_file()


def stopped_by_budget(run_dir: str | os.PathLike) -> bool:
    """Whether the run in ``run_dir`` has no result yet because a time budget stopped it (``progress.json``)."""
    run_dir = Path(run_dir)
    if is_finished(run_dir):
        return False
    return read_object_or_empty(run_dir / PROGRESS).get("status") == UNFINISHED


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds one of ``RUN_RECORDS`` (as a file)."""
    folder = Path(folder)
    return any((folder / name).is_file() for name in RUN_RECORDS)


@dataclass
class RunFolders:
    """The run folders below a folder, as ``find_run_folders`` finds them.

    Attributes:
        runs: run folders (``is_run_folder``), sorted, the searched folder itself included when it is one.
        links: symbolic links to run folders: never followed (a shared folder's link may lead anywhere, or loop),
            but named, so that no run is dropped without a word.
        unlisted: folders that could not be listed (their permissions) -> why; no run below one is seen.
    """

    runs: list[Path] = field(default_factory=list)
    links: list[Path] = field(default_factory=list)
    unlisted: dict[Path, str] = field(default_factory=dict)


def find_run_folders(root: str | os.PathLike) -> RunFolders:
    """Every run folder at or below ``root``, without following symbolic links.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a folder")
    found = RunFolders()
    errors: list[OSError] = []
    for folder, dirs, files in os.walk(root, onerror=errors.append):  # links are not followed
        here = Path(folder)
        if any(name in files for name in RUN_RECORDS):
            found.runs.append(here)
        found.links += [here / name for name in dirs
                        if (here / name).is_symlink() and is_run_folder(here / name)]
    found.unlisted = {Path(error.filename): error.strerror or str(error) for error in errors}
    found.runs.sort()
    found.links.sort()
    return found


def weights_record(run_dir: Path, path: Path) -> str:
    """How ``progress.json`` records a stage's checkpoint ``path``: relative to ``run_dir``, so the folder can move.

    Both are resolved first: Lightning hands back checkpoint paths made absolute, while ``run_dir`` may be relative
    (the default ``runs/train``) or reached through a symbolic link.
    """
    folder, target = run_dir.resolve(), path.resolve()
    if not target.is_relative_to(folder):
        raise ValueError(f"checkpoint {path} is outside the run folder {run_dir}")  # checkpoints/ is always inside
    return target.relative_to(folder).as_posix()


def recorded_weights(run_dir: Path, weights: Any) -> Path | None:
    """The checkpoint that a ``progress.json`` stage names as ``weights``, resolved; None unless it lies in ``run_dir``.

    A shared run folder is untrusted input: its record must not point at a file elsewhere. Paths are recorded
    relative to the folder; an absolute one counts where it resolves inside the folder (runs started with a
    relative ``run_dir`` before 2026-11-27 recorded such paths).
    """
    if not isinstance(weights, str) or not weights:
        return None
    path = (run_dir / weights).resolve()
    return path if path.is_relative_to(run_dir.resolve()) else None
