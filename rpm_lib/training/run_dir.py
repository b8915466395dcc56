"""The run folder of ``train``: its lock, what ``overwrite`` clears and ``resume`` checks, and its JSON records.

Before training, :func:`lock_run_dir` holds the folder's write lock and :func:`prepare_run_dir` refuses, clears
(``overwrite=true``) or checks (``resume=true``: the same config but for ``RESUMABLE_CHANGES``, data that moved
only with a recorded fingerprint) an earlier run there. A resumed run reads ``progress.json``
(:func:`read_progress`) and ``history.csv`` (:func:`check_history`) checked field by field, since a shared or
hand-edited folder is untrusted; :func:`finished_metrics` returns a finished run's results without training again.
:func:`write_json` is how ``train`` writes ``progress.json`` and ``metrics.json``: strict JSON (NaN as null),
atomically.
"""
from __future__ import annotations

import contextlib
import csv
import errno
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rpm_lib.folder_lock import FolderBusyError, UnsafeLockFileError, exclusive_writer
from rpm_lib.json_files import printable, read_object, shown_value, write_object
from rpm_lib.run_folder import (CHECKPOINTS, CONFIG, EXTRA_PREDICTIONS_GLOB, FINAL_WEIGHTS, FINISHED, HISTORY,
                                METRICS, PREDICTIONS, PROGRESS, RUN_LOCK, UNFINISHED, recorded_weights)
from rpm_lib.training.config import FINISHED_RUN_IGNORES, RESUMABLE_CHANGES, ConfigError, TrainConfig
from rpm_lib.training.history import HISTORY_COLUMNS
from rpm_lib.training.loggers import TENSORBOARD_DIR

#: Files and folders of a run that ``overwrite`` deletes and ``resume`` continues (with the per-set prediction
#: files of extra test sets, ``EXTRA_PREDICTIONS_GLOB``).
RUN_ARTIFACTS: tuple[str, ...] = (CHECKPOINTS, PROGRESS, HISTORY, METRICS, PREDICTIONS, FINAL_WEIGHTS,
                                  TENSORBOARD_DIR)


# ----------------------------------------------------------------------------------------------
# run folder
# ----------------------------------------------------------------------------------------------
def launch_rank() -> int:
    """Global rank known from the launcher's environment before any Trainer exists (0 when not launched)."""
    for name in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(name, "").isdigit():
            if name == "SLURM_PROCID" and int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
                continue
            return int(os.environ[name])
    # Lightning's own subprocess launcher marks its children with LOCAL_RANK / NODE_RANK.
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = int(os.environ.get("NODE_RANK", "0") or 0)
    return 0 if local == 0 and node == 0 else max(1, local)


def lock_run_dir(run_dir: Path, stack: contextlib.ExitStack) -> None:
    """Hold ``run_dir``'s write lock until ``stack`` closes: a second process on the same run folder (a batch
    started twice, a resume beside a running slice) is refused in one line instead of writing ``last.ckpt``,
    ``history.csv`` and ``progress.json`` over the first one's, or deleting them (``overwrite=true``).

    A file system without ``flock`` (some network mounts) gets a note and no lock.

    Raises:
        ConfigError: ``run_dir`` is a file or cannot be made, another process holds the lock, or something other
            than a regular file sits at the lock's path.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"config field 'run_dir': {run_dir} is a file, not a folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"config field 'run_dir': cannot make the folder {run_dir} ({error.strerror})") from None
    try:
        stack.enter_context(exclusive_writer(run_dir / RUN_LOCK, "rpm-train", folder=run_dir))
    except (FolderBusyError, UnsafeLockFileError) as error:
        raise ConfigError(f"config field 'run_dir': {error}") from None
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        print(f"rpm-train: note: {run_dir}: the file system offers no lock ({error.strerror}); make sure no other "
              "process trains in this run folder", file=sys.stderr)


def prepare_run_dir(config: TrainConfig, run_dir: Path) -> None:
    """Refuse, clear or check a run folder's earlier run; the folder itself was made by :func:`lock_run_dir`."""
    present = [name for name in RUN_ARTIFACTS if (run_dir / name).exists()]
    present += sorted(p.name for p in run_dir.glob(EXTRA_PREDICTIONS_GLOB))
    if config.resume and present and not (run_dir / CONFIG).is_file():
        # Without it nothing below can tell that this config (seed, lr, batch_size, ...) is the run's: the rest
        # of the run would silently train with other settings, and metrics.json record only the new ones.
        raise ConfigError(f"resume: {run_dir} holds a run ({', '.join(present)}) but no {CONFIG}, so nothing "
                          f"shows that this config is the one it started with; put its {CONFIG} back, or use "
                          "overwrite=true")
    if present and not config.resume:
        if not config.overwrite:
            raise ConfigError(
                f"config field 'run_dir': {run_dir} already holds a run ({', '.join(present)}); set resume=true "
                "to continue it or overwrite=true to replace it"
            )
        for name in present:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    if config.resume and (run_dir / CONFIG).is_file():
        previous = TrainConfig.from_yaml(run_dir / CONFIG).to_dict()
        current = config.to_dict()
        changed = sorted(k for k in current if k not in RESUMABLE_CHANGES and previous.get(k) != current[k])
        if changed:
            raise ConfigError(
                f"resume: {run_dir}/{CONFIG} differs in {', '.join(changed)}; resuming would mix two runs "
                "(use another run_dir or overwrite=true)"
            )
        moved = previous.get("data_root") != current["data_root"]
        if moved and "data_fingerprint" not in read_run_json(run_dir / PROGRESS):
            # Only a recorded fingerprint can tell that data in another folder are the same data.
            raise ConfigError(f"resume: {run_dir}/{PROGRESS} records no data fingerprint, so data_root cannot "
                              f"move ({previous.get('data_root')} -> {current['data_root']}); resume with the "
                              "original data_root")


def finished_metrics(run_dir: Path, progress: dict[str, Any], config: TrainConfig) -> dict[str, Any] | None:
    """The stored metrics of a finished run resumed with the same test sets (nothing left to do), else None.

    A finished run's archive (``rpm-batch pack``) carries no weights, so it must not be evaluated again; with
    other ``test_data_roots`` it is (and then needs its weights).
    """
    if progress.get("status") != FINISHED or not (run_dir / METRICS).is_file():
        return None
    metrics = read_run_json(run_dir / METRICS)
    if metrics.get("config", {}).get("test_data_roots") != config.test_data_roots:
        return None
    ignored = [f"{name} {metrics['config'][name]!r} -> {getattr(config, name)!r}" for name in config.field_names()
               if name in FINISHED_RUN_IGNORES and name in metrics.get("config", {})
               and metrics["config"][name] != getattr(config, name)]
    if ignored:
        print(f"rpm-train: note: {run_dir} is finished, so {'; '.join(ignored)} changes nothing: its results stay "
              f"those of {METRICS} (train in another run_dir, or overwrite=true, to use them)", file=sys.stderr)
    return metrics


def inside_run_dir(run_dir: Path, weights: Any) -> Path:
    """The checkpoint a ``progress.json`` names, refused in one line unless it lies inside ``run_dir``."""
    if not isinstance(weights, str) or not weights:
        raise ConfigError(f"resume: {run_dir / PROGRESS}: field 'weights' must be a checkpoint path "
                          f"inside the run folder, got {weights!r}")
    path = recorded_weights(run_dir, weights)
    if path is None:
        raise ConfigError(f"resume: {run_dir / PROGRESS}: field 'weights' ({weights}) points outside the run "
                          "folder; refusing to load it")
    return path


def read_run_json(path: Path) -> dict[str, Any]:
    """A JSON record of the run folder (``{}`` when absent); a broken one is a ConfigError naming it."""
    return read_object(path, ConfigError, "delete it or use overwrite=true", missing_ok=True)


def read_progress(path: Path) -> dict[str, Any]:
    """``progress.json`` (``{}`` when absent), every field a resumed run reads checked for its type (see
    :class:`rpm_lib.training.progress_record.ProgressRecord` for the layout).

    A shared or hand-edited file is untrusted: ``"slices": "abc"`` or a number as ``data_fingerprint`` failed with a
    traceback after the whole slice had trained, ``"epochs": "x"`` before the second stage.

    Raises:
        ConfigError: ``<path>: field '<name>' must be ...; delete it or use overwrite=true``.
    """
    progress = read_run_json(path)

    def refuse(field: str, what: str) -> ConfigError:
        return ConfigError(f"{path}: field {field!r} must be {what}; delete it or use overwrite=true")

    stages = progress.get("stages", {})
    if not isinstance(stages, dict) or not all(isinstance(s, dict) for s in stages.values()):
        raise refuse("stages", "a mapping of stage names to objects")
    for name, summary in stages.items():
        for key in ("epochs", "global_step"):
            value = summary.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise refuse(f"stages.{name}.{key}", f"a whole number >= 0, got {value!r}")
        for key in ("completed", "skipped"):
            if key in summary and not isinstance(summary[key], bool):
                raise refuse(f"stages.{name}.{key}", f"true or false, got {summary[key]!r}")
    if progress.get("status") not in (None, FINISHED, UNFINISHED):
        raise refuse("status", f"{FINISHED!r} or {UNFINISHED!r}, got {progress['status']!r}")
    for field in ("slices", "data_changes"):
        value = progress.get(field, [])
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise refuse(field, "a list of objects")
    for field in ("data_fingerprint", "data_problems"):
        if not isinstance(progress.get(field, ""), str):
            raise refuse(field, f"a fingerprint string, got {progress[field]!r}")
    if not isinstance(progress.get("data_opencv") or {}, dict):
        raise refuse("data_opencv", f"an object, got {progress['data_opencv']!r}")
    return progress


def check_history(path: Path) -> None:
    """Refuse, in one line, a ``history.csv`` that a resumed stage cannot read back (it keeps the rows before the
    resume point) or that would lend the run numbers it never had: text that is not UTF-8 CSV, a NUL byte, no
    ``stage`` or ``epoch`` column, a column ``history.csv`` does not have, a row with more cells than the header,
    an epoch or step that is no whole number, a loss, accuracy or learning rate that is no number.

    Checked before training: the stage read it only when it started, or when it ended, with a traceback.

    Raises:
        ConfigError: naming the file and the line.
    """
    advice = "fix that line or delete the file (the run then resumes without the rows before), or use overwrite=true"
    if not path.is_file():
        return
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            records = list(_numbered_records(csv.reader(handle)))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"resume: {path}: unreadable ({type(error).__name__}: {printable(error, 200)}); delete "
                          "it (the run then resumes without the rows before) or use overwrite=true") from None
    if not records:
        return

    def refuse(number: int, what: str) -> ConfigError:
        return ConfigError(f"resume: {path}: line {number}: {what}; {advice}")

    for number, cells in records:
        if any("\x00" in cell for cell in cells):
            # What a crash or a damaged copy leaves; the csv module reads it as text, so the row would pass.
            raise refuse(number, "holds a NUL byte (a damaged file)")
    (_, header), rows = records[0], records[1:]
    if "stage" not in header or "epoch" not in header:
        raise refuse(1, "no 'stage' and 'epoch' columns")
    unknown = [column for column in header if column not in HISTORY_COLUMNS]
    if unknown:
        # The stage writes the file back with its own columns only, and failed on any other one.
        raise refuse(1, f"column {shown_value(unknown[0])} is not one of {', '.join(HISTORY_COLUMNS)}")
    for number, cells in rows:
        if len(cells) > len(header):
            raise refuse(number, f"{len(cells)} cells where the header names {len(header)} columns")
        row = dict(zip(header, cells))
        if row.get("stage") is None or row.get("epoch") is None:
            raise refuse(number, "no 'stage' and 'epoch' columns")
        for column in ("epoch", "step"):
            value = row.get(column, "")
            if (column == "epoch" or value.strip()) and not (value.strip().isascii() and value.strip().isdigit()):
                raise refuse(number, f"{column} {shown_value(value)} is not a whole number >= 0")
        for column in ("train_loss", "val_loss", "val_accuracy", "lr"):
            value = row.get(column, "")
            if value.strip():
                try:
                    float(value)
                except ValueError:
                    raise refuse(number, f"{column} {shown_value(value)} is not a number") from None


def _numbered_records(reader: Any) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each non-blank record of a ``csv.reader``, numbered by the line it starts on."""
    start = 1
    for cells in reader:
        if cells:
            yield start, cells
        start = reader.line_num + 1


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as strict JSON (NaN, e.g. the AP of a rule with no positives, becomes null), written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_object(path, finite_for_json(data), default=_json_default, allow_nan=False)


def finite_for_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) in nested dicts / lists replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_for_json(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
