"""Where each run of a batch folder stands: status, stage, epochs, validation accuracy (``rpm-batch progress``).

Read from the files a run keeps up to date while it trains (``progress.json``, ``history.csv``,
``metrics.json``), so it works on a batch that is running, stopped by a time budget, or unpacked from an
archive; light to import (no Lightning).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpm_lib.json_files import printable, read_object, shown_value
from rpm_lib.run_folder import (FINISHED, HISTORY, METRICS, PROGRESS, UNFINISHED, RunStatus, find_run_folders,
                                is_finished)
from rpm_lib.runs.plan import epoch_limits, run_config, train_config
from rpm_lib.training import early_stopping
from rpm_lib.training.history import history_rows

#: What a damaged record raises while it is read here (wrong types, missing columns, bad numbers, bad bytes).
_DAMAGE = (KeyError, IndexError, TypeError, ValueError, AttributeError, UnicodeDecodeError, csv.Error)


class _Damaged(ValueError):
    """A field of a run's record that no run writes, named with its file."""


def _record(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when absent. Raises ``ValueError`` naming the file when it is not one."""
    return read_object(path, ValueError, missing_ok=True, shown=path.name)


@dataclass(frozen=True)
class RunProgress:
    """One run's standing.

    Attributes:
        run: folder relative to the batch folder.
        status: a ``RunStatus``: ``finished`` (``metrics.json``), ``unfinished`` (stopped by a time budget),
            ``running or killed`` (history but no record of an end), or ``not started``; or a line of text for a
            folder that could not be read: ``damaged: <file>: <why>``, ``skipped: <why>``.
        stage: the stage it is in (the last stage for a finished run; ``evaluation`` when only that is left).
        epochs: finished epochs per stage, e.g. ``{"pretrain": 12, "linear": 3}``.
        val_accuracy: validation accuracy (fraction) of the last finished epoch that has one, or None.
        best_val_accuracy: the highest such accuracy so far, or None.
        test_accuracy: from ``metrics.json`` once finished, else None.
        slices: time slices recorded in ``progress.json``.
        seconds: wall seconds of those slices together.
        steps: optimiser steps of all stages so far (``progress.json``; finished and interrupted stages).
        rpms: problems trained on so far: each stage's steps times its batch size (views not counted).
        data_changes: times the run went on with other pixels of the same problems (``data_check=problems``;
            ``progress.json`` ``data_changes``, rpm_lib.data.opencv_version).
        first_step_s: seconds from the start of the last slice's training call until its first training step had
            ended (the call's start-up: data check, checkpoint, loaders, CUDA, that first step), or None when that
            slice trained no step or was recorded before this was.
        called_at: when the last slice's training call began (``time.time()`` seconds), or None when not recorded.
        process_s: how long the process making that call had been running by then (for a notebook run: its
            kernel's start and imports), or None when not recorded or not known (only Linux says).
        best_val_loss: the validation loss of the epoch whose weights the stage in progress (a finished run: its
            last stage) keeps so far, as early stopping judges it (a lower loss by more than ``min_delta``), or None.
        best_val_loss_epoch: that epoch, counted from 1 within the stage, or None.
        epochs_left: (fewest, most) epochs that early stopping can still give the stage in progress: fewest if its
            validation loss never beats ``best_val_loss`` again (the stage ends after ``patience`` epochs in a row
            without), most up to the stage's epoch limit. None for a finished run, or when ``config.yaml`` does not
            say (a later stage, e.g. linear evaluation, is not counted).
    """

    run: str
    status: RunStatus | str
    stage: str | None
    epochs: dict[str, int]
    val_accuracy: float | None
    best_val_accuracy: float | None
    test_accuracy: float | None
    slices: int
    seconds: float
    steps: int = 0
    rpms: int = 0
    data_changes: int = 0
    first_step_s: float | None = None
    called_at: float | None = None
    process_s: float | None = None
    best_val_loss: float | None = None
    best_val_loss_epoch: int | None = None
    epochs_left: tuple[int, int] | None = None


def run_progress(run_dir: str | Path, batch_dir: str | Path | None = None) -> RunProgress:
    """The standing of the run in ``run_dir`` (named relative to ``batch_dir`` when given).

    A damaged ``progress.json``, ``metrics.json`` or ``history.csv`` gives the status ``damaged: <file>: <why>``
    (one line, nothing else read), so one broken run folder neither stops the table nor passes for a run that has
    not started."""
    run_dir = Path(run_dir)
    name = run_dir.relative_to(batch_dir).as_posix() if batch_dir is not None else run_dir.name
    try:
        return _run_progress(run_dir, name)
    except ValueError as error:
        return RunProgress(run=name, status=f"damaged: {error}", stage=None, epochs={}, val_accuracy=None,
                           best_val_accuracy=None, test_accuracy=None, slices=0, seconds=0.0)


def _history(path: Path) -> tuple[dict[str, int], list[float], str | None, dict[str, list[float]]]:
    """Finished epochs per stage, validation accuracies, the last stage of ``history.csv`` and the validation losses
    of each stage (NaN where an epoch has none)."""
    epochs: dict[str, int] = {}
    accuracies = []
    losses: dict[str, list[float]] = {}
    try:
        rows = history_rows(path)
        for number, row in enumerate(rows, start=2):
            epoch = int(row["epoch"])
            # A shared history.csv is untrusted: a negative epoch, or an accuracy that is no fraction (NaN, inf, 55,
            # -0.3; the writer leaves NaN empty) would otherwise show as a wrong epoch count or "best val % nan".
            if epoch < 0:
                raise ValueError(f"line {number}: epoch {epoch} is negative")
            epochs[row["stage"]] = max(epochs.get(row["stage"], 0), epoch + 1)
            if row.get("val_accuracy"):
                accuracies.append(_fraction(float(row["val_accuracy"]), f"line {number}: val_accuracy"))
            losses.setdefault(row["stage"], []).append(float(row["val_loss"]) if row.get("val_loss") else math.nan)
    except _DAMAGE as error:
        why = str(error).splitlines()[0] if str(error) else ""
        raise ValueError(f"{path.name}: unreadable ({type(error).__name__}: {why})") from None
    return epochs, accuracies, rows[-1]["stage"] if rows else None, losses


def _fraction(value: float, what: str) -> float:
    """``value`` when it is an accuracy (a finite fraction in [0, 1]); raises ``ValueError`` naming ``what``."""
    if not 0.0 <= value <= 1.0:  # also false for NaN
        raise ValueError(f"{what} {value!r} is not a fraction in [0, 1]")
    return value


def _run_progress(run_dir: Path, name: str) -> RunProgress:
    progress = _record(run_dir / PROGRESS)
    metrics = _record(run_dir / METRICS)
    test = metrics.get("test_accuracy")
    # checked here, not where the table formats it: "abc" or [1] crashed the whole table, true showed as 100 %
    if test is not None and (isinstance(test, bool) or not isinstance(test, (int, float))
                             or not 0.0 <= test <= 1.0):
        raise ValueError(f"{METRICS}: test_accuracy {test!r} is not a fraction in [0, 1]")
    epochs, accuracies, stage, losses = _history(run_dir / HISTORY)
    try:
        return _standing(run_dir, name, progress, metrics, epochs, accuracies, stage, losses)
    except _Damaged:
        raise  # already one line naming the file and the field
    except _DAMAGE as error:
        raise ValueError(f"{PROGRESS} or {METRICS}: a field of the wrong type ({type(error).__name__}: "
                         f"{error})") from None


def _standing(run_dir: Path, name: str, progress: dict[str, Any], metrics: dict[str, Any], epochs: dict[str, int],
              accuracies: list[float], stage: str | None, losses: dict[str, list[float]]) -> RunProgress:
    status: RunStatus
    if is_finished(run_dir):
        status = FINISHED
    elif progress.get("status") == UNFINISHED:
        status = UNFINISHED
        slices = progress.get("slices") or [{}]
        stage = slices[-1].get("ended_in", stage)
    elif epochs:
        status = RunStatus.RUNNING_OR_KILLED
    else:
        status = RunStatus.NOT_STARTED
    slices = progress.get("slices") or []
    # A negative or endless time, step count or batch showed as such (-3600 s); no run has one, so the record is
    # damaged or edited, like a field of the wrong type.
    seconds = [_count(s.get("seconds") or 0.0, f"slices[{i}].seconds", float) for i, s in enumerate(slices)]
    summaries = {key: s for key, s in (progress.get("stages") or {}).items() if isinstance(s, dict)}
    stage_steps = {key: _count(s.get("global_step") or 0, f"stages.{printable(key)}.global_step")
                   for key, s in summaries.items()}
    steps = sum(stage_steps.values())
    values = run_config(run_dir)
    batch = _batch_size(values)
    rpms = sum(stage_steps[key] * (_count(s["batch_size"], f"stages.{printable(key)}.batch_size")
                                   if s.get("batch_size") else batch) for key, s in summaries.items())
    last = slices[-1] if slices else {}
    # a hand-edited or older record: no start-up figure, not a wrong one
    first_step, called_at, process_s = (_seconds(last.get(key), f"slices[{len(slices) - 1}].{key}")
                                        for key in ("first_step_s", "called_at", "process_s"))
    best_loss, best_epoch, left = _early_stopping(values, status, stage, epochs, losses)
    return RunProgress(
        run=name, status=status, stage=stage, epochs=epochs,
        val_accuracy=accuracies[-1] if accuracies else None,
        best_val_accuracy=max(accuracies) if accuracies else None,
        test_accuracy=metrics.get("test_accuracy"), slices=len(slices),
        seconds=round(sum(seconds), 1), steps=steps, rpms=rpms,
        data_changes=len(progress.get("data_changes") or []), first_step_s=first_step, called_at=called_at,
        process_s=process_s, best_val_loss=best_loss, best_val_loss_epoch=best_epoch, epochs_left=left)


def _early_stopping(values: dict[str, Any] | None, status: str, stage: str | None, epochs: dict[str, int],
                    losses: dict[str, list[float]]) -> tuple[float | None, int | None, tuple[int, int] | None]:
    """(best validation loss, its epoch, epochs left) of ``stage`` for the run whose ``config.yaml`` holds
    ``values`` (see :class:`RunProgress`)."""
    config = None if values is None else train_config(values)
    if config is None or stage is None:
        return None, None, None
    stage_losses = losses.get(stage, [])
    standing = early_stopping.replay(stage_losses, config.min_delta)
    limit = (epoch_limits(config) or {}).get(stage)
    if status == FINISHED or limit is None:
        return standing.best_loss, standing.best_epoch, None
    left = early_stopping.epochs_left(stage_losses, epochs.get(stage, 0), limit, config.patience, config.min_delta)
    return standing.best_loss, standing.best_epoch, left


def _seconds(value: Any, what: str) -> float | None:
    """``value`` when it is a number of seconds (not a bool), else None; raises ``ValueError`` naming ``what``
    for a number that is negative or not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return _count(value, what, float)


def _count(value: Any, what: str, kind: type = int) -> Any:
    """``value`` when it is a finite number >= 0 (a whole one for ``kind=int``); raises ``ValueError`` naming
    ``progress.json``'s field ``what`` otherwise."""
    whole = kind is int
    if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
            or not (math.isfinite(value) and value >= 0)):
        raise _Damaged(f"{PROGRESS}: {what} {shown_value(value)} is not a "
                       f"{'whole number' if whole else 'number of seconds'} >= 0")
    return value


def _batch_size(values: dict[str, Any] | None) -> int:
    """``batch_size`` of a run's ``config.yaml`` ``values`` (0 when unreadable): the batch of a stage cut short,
    whose summary has none."""
    try:
        return int((values or {}).get("batch_size") or 0)
    except (TypeError, ValueError):
        return 0


#: Status of a run folder reached through a symbolic link (``batch_progress`` does not follow links).
SYMLINK_STATUS = "skipped: a symbolic link (not followed; run rpm-batch progress on its target)"


def batch_progress(batch_dir: str | Path) -> list[RunProgress]:
    """The standing of every run folder at or below ``batch_dir`` (``rpm_lib.run_folder.find_run_folders``).

    Symbolic links are not followed (a shared folder's link may lead anywhere, or loop); a link to a run folder is
    listed with the status ``SYMLINK_STATUS``, and a folder that cannot be listed (its permissions) with a
    ``skipped: ...`` status, rather than dropped without a word."""
    batch_dir = Path(batch_dir)
    found = find_run_folders(batch_dir)
    standing = [run_progress(run, batch_dir) for run in found.runs]
    standing += [_skipped(link.relative_to(batch_dir).as_posix(), SYMLINK_STATUS) for link in found.links]
    standing += [_skipped(folder.relative_to(batch_dir).as_posix(), f"skipped: cannot be listed ({why}); no run "
                          "below it is shown") for folder, why in sorted(found.unlisted.items())]
    return standing


def _skipped(run: str, status: str) -> RunProgress:
    """The row of a folder that was not read: ``status`` says why."""
    return RunProgress(run=run, status=status, stage=None, epochs={}, val_accuracy=None, best_val_accuracy=None,
                       test_accuracy=None, slices=0, seconds=0.0)


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: a run folder named with ``|`` or a line break kept its row apart."""
    return " ".join(text.splitlines()).replace("|", "\\|")


def percent(value: float | None) -> str:
    """A fraction as a table cell in percent with one decimal (empty for None)."""
    return "" if value is None else f"{100 * value:.1f}"


def epochs_left_text(left: tuple[int, int] | None) -> str:
    """``RunProgress.epochs_left`` as a table cell: ``6–61``, ``10`` when both are equal, empty when not known."""
    if left is None:
        return ""
    return str(left[0]) if left[0] == left[1] else f"{left[0]}–{left[1]}"


def progress_table(runs: list[RunProgress]) -> str:
    """A Markdown table of ``runs``: status, stage, epochs per stage, the epochs early stopping can still give the
    stage (fewest–most), accuracies (%), slices, seconds."""
    lines = ["| run | status | stage | epochs | epochs left in stage | last val % | best val % | test % | slices | seconds |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        epochs = ", ".join(f"{stage} {count}" for stage, count in run.epochs.items())
        lines.append(f"| {_cell(run.run)} | {_cell(run.status)} | {_cell(str(run.stage or ''))} | {_cell(epochs)} | "
                     f"{epochs_left_text(run.epochs_left)} | {percent(run.val_accuracy)} | "
                     f"{percent(run.best_val_accuracy)} | {percent(run.test_accuracy)} | {run.slices} | "
                     f"{run.seconds:g} |")
    changed = [run.run for run in runs if run.data_changes]
    if changed:
        lines += ["", f"Went on with other pixels of the same problems (data_check=problems; data_changes in their "
                      f"progress.json): {', '.join(changed)}"]
    return "\n".join(lines)


def progress_figure(batch_dir: str | Path, runs: list[RunProgress] | None = None, paper: bool = False,
                    title: str | None = None) -> Any:
    """A matplotlib ``Figure``: validation accuracy of every run of ``batch_dir`` over its epochs.

    Args:
        batch_dir: the batch folder.
        runs: its ``batch_progress`` (read again when not given).
        paper: draw, for each run whose ``config.yaml`` names an encoder and setup of the MLCL paper's Table 1, that
            row's test average as a dashed line (meaningful for I-RAVEN runs at the paper's settings only).
        title: the figure's title (default: the folder's name).

    A run whose ``history.csv`` is missing or damaged is listed with "no accuracy yet" (``rpm-batch progress``'s
    table says which).
    """
    from rpm_lib.training.history import history_columns
    from rpm_lib.viz.training_curves import plot_runs_accuracy

    batch_dir = Path(batch_dir)
    runs = batch_progress(batch_dir) if runs is None else runs
    curves: dict[str, dict[str, Any]] = {}
    references: dict[str, float] = {}
    for run in runs:
        try:
            # a run the table calls damaged (text or out-of-range numbers in history.csv) is drawn without a curve:
            # plotting its columns raised a traceback, or drew epoch 1e308
            curves[run.run] = ({} if run.status.startswith(("damaged", "skipped"))
                               else history_columns(batch_dir / run.run / HISTORY))
        except (OSError, ValueError, csv.Error):
            curves[run.run] = {}
        if paper:
            reference = _paper_average(batch_dir / run.run)
            if reference is not None:
                references[run.run] = reference
    notes = {run.run: f"finished, test {100 * run.test_accuracy:.1f} %" if run.test_accuracy is not None
             else ", ".join([run.status, *(f"{stage} {count} ep" for stage, count in run.epochs.items())])
             for run in runs}
    return plot_runs_accuracy(curves, references, {run.run: run.status == FINISHED for run in runs}, notes,
                              reference_label="the paper's Table 1 test average",
                              title=title or f"{batch_dir.name}: validation accuracy per run")


def _paper_average(run_dir: Path) -> float | None:
    """The MLCL paper's Table 1 average (percent) for the encoder and setup in ``run_dir/config.yaml``, if any."""
    from rpm_lib.results import paper_row

    values = run_config(run_dir)
    try:
        row = paper_row(str(values["encoder"]), str(values["setup"]))
    except (KeyError, TypeError, ValueError):  # TypeError: no readable config.yaml
        return None
    return None if row is None else row.average
