"""The JSON records of run, batch and data folders (``progress.json``, ``metrics.json``, ``generator.json``, ...).

Reading: one object, or one line naming the file; these files come from shared folders, so their content is
checked, never trusted: a file over ``max_bytes`` (:data:`MAX_BYTES`) or nested deeper than ``max_depth``
(:data:`MAX_DEPTH`) is refused before it is parsed (``json.loads`` recurses: text nested 100,000 deep would end in
a ``RecursionError``), a field of the wrong type when the caller names its ``fields``, and messages echo a value
only through :func:`printable` (control characters escaped, at most 80 characters).

Writing: ``write_object``, the one atomic JSON write of rpm_lib, so that a kill or a full disk never leaves a
half-written record under its final name.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rpm_lib.atomic_files import write_atomically

#: Largest JSON file read by default (a batch's records are KBs; callers with bigger files pass ``max_bytes``).
MAX_BYTES = 64 << 20
#: Deepest nesting of arrays and objects read by default (the records nest a few levels).
MAX_DEPTH = 200
#: How many characters of a value a message shows at most (:func:`printable`).
SHOWN_CHARS = 80


def printable(text: object, limit: int = SHOWN_CHARS) -> str:
    """``text`` (``str()`` of anything else) safe to print on one line of a terminal: control characters
    (terminal escape sequences, newlines, carriage returns, bidirectional overrides) escaped as ``repr`` writes
    them, and cut to ``limit`` characters with ``...``. The one way messages and reports echo text from files."""
    text = text if isinstance(text, str) else str(text)
    if len(text) > 4 * limit:  # never escape a huge value whole just to cut it
        text = text[:4 * limit]
        cut = True
    else:
        cut = False
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    if cut or len(shown) > limit:
        return shown[:limit - 3] + "..." if limit > 3 else shown[:limit]
    return shown


def shown_value(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters (a huge list or string is never printed
    whole); :func:`printable` of it, so a str subclass's odd ``repr`` cannot slip control characters through."""
    if isinstance(value, str) and len(value) > 4 * limit:  # cut before repr: printable then ends it with "..."
        return printable(repr(value[:4 * limit]), limit=limit)
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:  # repr of a huge container: costly
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = repr(value)
    except RecursionError:  # a self-referencing or very deep value
        return f"<{type(value).__name__}>"
    return printable(text, limit=limit)


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
                missing_ok: bool = False, shown: str | None = None, *, max_bytes: int = MAX_BYTES,
                max_depth: int = MAX_DEPTH, fields: Mapping[str, type | tuple[type, ...]] | None = None
                ) -> dict[str, Any]:
    """The JSON object in ``path``.

    Args:
        path: the file.
        error: the exception type raised for a file that is not a JSON object (the caller's own error type).
        advice: appended to the message after ``; `` (what the user can do).
        missing_ok: return ``{}`` for a missing file instead of raising ``FileNotFoundError``.
        shown: how the messages name the file (default: ``path`` as given), e.g. its name alone in a table cell.
        max_bytes: largest file read (:data:`MAX_BYTES`); a bigger one is refused before it is read whole.
        max_depth: deepest nesting of arrays and objects (:data:`MAX_DEPTH`), checked before parsing.
        fields: the types of fields that must have them when present, e.g. ``{"job_id": str}`` (``bool`` is
            never an ``int`` here); a field of another type is refused, naming it.

    Raises:
        error: one line naming the file: ``<path>: not valid JSON (...)``, ``<path>: expected a JSON object, got
            list``, ``<path>: larger than 67108864 bytes ...``, ``<path>: nested deeper than 200 levels ...``,
            ``<path>: field 'job_id' must be str, got int``.
    """
    if missing_ok and not path.is_file():
        return {}
    name = path if shown is None else shown
    suffix = f"; {advice}" if advice else ""
    text = _read_bounded(path, max_bytes, error, name, suffix)
    return parse_object(text, name, error, advice, max_depth=max_depth, fields=fields)


def parse_object(text: str | bytes, name: object, error: type[Exception] = ValueError, advice: str = "", *,
                 max_depth: int = MAX_DEPTH, fields: Mapping[str, type | tuple[type, ...]] | None = None
                 ) -> dict[str, Any]:
    """The JSON object in ``text`` (a file's content already read, e.g. an archive member's), checked as
    :func:`read_object` checks a file's; messages name the file as ``name``. The caller bounds the size."""
    suffix = f"; {advice}" if advice else ""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(f"{name}: not valid JSON ({problem}){suffix}") from None
    if _too_deep(data, max_depth):
        raise error(f"{name}: nested deeper than {max_depth} levels; not a record this tool writes{suffix}")
    try:
        value = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
    except json.JSONDecodeError as problem:
        raise error(f"{name}: not valid JSON ({problem}){suffix}") from None
    except RecursionError:  # the bound above is deeper than the interpreter allows
        raise error(f"{name}: nested too deep to read; not a record this tool writes{suffix}") from None
    except _RepeatedKey as repeated:
        raise error(f"{name}: the key {shown_value(repeated.args[0])} is given twice (JSON readers keep only the "
                    f"last; which was meant?){suffix}") from None
    if not isinstance(value, dict):
        raise error(f"{name}: expected a JSON object, got {type(value).__name__}{suffix}")
    for field, types in (fields or {}).items():
        if field in value and not _has_type(value[field], types):
            wanted = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise error(f"{name}: field {shown_value(field)} must be {wanted}, got {type(value[field]).__name__} "
                        f"{shown_value(value[field], 40)}{suffix}")
    return value


def _has_type(value: Any, types: type | tuple[type, ...]) -> bool:
    options = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in options:  # JSON's true is no number
        return False
    return isinstance(value, options)


def _read_bounded(path: Path, max_bytes: int, error: type[Exception], name: object, suffix: str) -> bytes:
    """At most ``max_bytes`` of ``path``, or ``error`` (a bigger file is never read whole: it may grow, or be a
    pipe, so the read itself is bounded too)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        chunks: list[bytes] = []
        total = 0
        while size <= max_bytes and total <= max_bytes:  # read(n) allocates n bytes: never max_bytes for a small file
            chunk = handle.read(min(max(size + 1, 1 << 16), max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    if size > max_bytes or total > max_bytes:
        raise error(f"{name}: larger than {max_bytes} bytes; not a record this tool writes{suffix}")
    return b"".join(chunks)


#: A JSON string (its escapes included): brackets inside one do not nest.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: Every byte but brackets deleted, and ``{}`` read as ``[]`` (only the depth counts here).
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _too_deep(data: bytes, max_depth: int) -> bool:
    """Whether arrays and objects in ``data`` nest deeper than ``max_depth``, found without recursion and without
    parsing (``json.loads`` recurses once per level): with strings and all but brackets removed, each pass removes
    the innermost pairs, so a pair still left after ``max_depth`` passes lies deeper. Brackets that do not pair
    (text that is not JSON) are left to ``json.loads`` to report."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    skeleton = _STRING.sub(b"", data).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(max_depth):
        reduced = skeleton.replace(b"[]", b"")
        if len(reduced) == len(skeleton):
            return False
        skeleton = reduced
    return b"[]" in skeleton


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


def read_object_or_empty(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
                         fields: Mapping[str, type | tuple[type, ...]] | None = None) -> dict[str, Any]:
    """The JSON object in ``path``, or ``{}`` when the file is missing, unreadable or not an object: for records
    that only inform (a status, a version), where an absent or damaged record means "unknown". Damaged includes
    what :func:`read_object` refuses: over ``max_bytes``, nested deeper than ``max_depth``, a field of ``fields``
    of another type (a key given twice keeps the last, as before)."""
    try:
        text = _read_bounded(path, max_bytes, ValueError, path, "")
        if _too_deep(text, max_depth):
            return {}
        value = json.loads(text)
    except (OSError, ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return {}
    if not isinstance(value, dict):
        return {}
    if any(field in value and not _has_type(value[field], types) for field, types in (fields or {}).items()):
        return {}
    return value
