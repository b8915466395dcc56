"""``history.csv``, a run's per-epoch record: its columns and its two readings (rows for resuming, columns
for plotting). Written by :class:`rpm_lib.training.callbacks.HistoryCallback`; light to import (no Lightning)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

#: Columns of ``history.csv`` (one row per stage and epoch).
HISTORY_COLUMNS: tuple[str, ...] = ("stage", "epoch", "step", "train_loss", "val_loss", "val_accuracy", "lr")


def history_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a ``history.csv`` as dicts of strings ([] when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def history_columns(path: str | Path) -> dict[str, np.ndarray]:
    """Columns of a ``history.csv`` as float arrays (empty cells -> NaN; non-numeric columns such as
    ``stage`` kept as object arrays of str), for plotting.

    Raises:
        FileNotFoundError: no such file. ValueError: the file has no header.
    """
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty history file (no header)")
        raw: dict[str, list[str]] = {k: [] for k in reader.fieldnames}
        for row in reader:
            for k in raw:
                raw[k].append(row.get(k) or "")
    out: dict[str, np.ndarray] = {}
    for k, values in raw.items():
        try:
            out[k] = np.array([float(v) if v != "" else np.nan for v in values])
        except ValueError:
            out[k] = np.array(values, dtype=object)
    return out
