"""Reading the JSON records of run and batch folders (``progress.json``, ``metrics.json``, ...): one object, or one
line naming the file. These files come from shared folders, so their content is checked, never trusted."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
