"""The JSON records of run, batch and data folders (``progress.json``, ``metrics.json``, ``generator.json``, ...).

Reading: one object, or one line naming the file; these files come from shared folders, so their content is
checked, never trusted. Writing: ``write_object``, the one atomic JSON write of rpm_lib, so that a kill or a full
disk never leaves a half-written record under its final name.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpm_lib.atomic_files import write_atomically


def write_object(path: str | os.PathLike, value: Any, *, indent: int | None = 2,
                 separators: tuple[str, str] | None = None, sort_keys: bool = False, fsync: bool = True,
                 default: Callable[[Any], Any] | None = None, allow_nan: bool = True) -> None:
    """Write ``value`` as JSON (and a final newline) to ``path`` atomically.

    The text goes to a hidden temporary file in the same folder (so the rename is atomic and no loader's glob
    matches it), is flushed to disk (``fsync``), then renamed over ``path``; the temporary file is removed when
    anything fails, a kill aside.

    Args:
        path: the record's final name.
        value: anything ``json.dumps`` takes.
        indent, separators, sort_keys, default, allow_nan: as ``json.dumps`` (records people read are indented;
            large machine records are compact).
        fsync: flush the bytes to disk before the rename (a record that resuming relies on); False where the file
            is rebuilt from scratch anyway when lost.
    """
    text = json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, default=default,
                      allow_nan=allow_nan) + "\n"
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")), fsync=fsync)


def read_object(path: Path, error: type[Exception] = ValueError, advice: str = "",
                missing_ok: bool = False, shown: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path``.

    Args:
        path: the file.
        error: the exception type raised for a file that is not a JSON object (the caller's own error type).
        advice: appended to the message after ``; `` (what the user can do).
        missing_ok: return ``{}`` for a missing file instead of raising ``FileNotFoundError``.
        shown: how the messages name the file (default: ``path`` as given), e.g. its name alone in a table cell.

    Raises:
        error: ``<path>: not valid JSON (...)`` or ``<path>: expected a JSON object, got list``.
    """
    if missing_ok and not path.is_file():
        return {}
    suffix = f"; {advice}" if advice else ""
    name = path if shown is None else shown
    try:
        value = json.loads(path.read_text(), object_pairs_hook=_refuse_repeated_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as problem:
        raise error(f"{name}: not valid JSON ({problem}){suffix}") from None
    except _RepeatedKey as repeated:
        raise error(f"{name}: the key {repeated.args[0]!r} is given twice (JSON readers keep only the last; which "
                    f"was meant?){suffix}") from None
    if not isinstance(value, dict):
        raise error(f"{name}: expected a JSON object, got {type(value).__name__}{suffix}")
    return value


class _RepeatedKey(Exception):
    """A JSON object names a key twice."""


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # a hand-edited record with a key twice ("test_accuracy" added below the old one) would silently count only
    # the last, as Python's json module does: refused, as the YAML files are
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _RepeatedKey(key)
        value[key] = item
    return value


def read_object_or_empty(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or ``{}`` when the file is missing, unreadable or not an object: for records
    that only inform (a status, a version), where an absent or damaged record means "unknown"."""
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}
