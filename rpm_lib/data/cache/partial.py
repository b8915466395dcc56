"""An interrupted cache build (``<out>.partial/``): its journal of finished chunks, its plan, whether it can be
continued, and its removal when it cannot."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from rpm_lib.atomic_files import TEMP_SUFFIX
from rpm_lib.data.cache.format import (JOURNAL, MANIFEST, PLAN, SKIPPED, Kind, array_header, build_layout, check_cache,
                                       is_cache, read_manifest)
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import CACHE_ARRAY
from rpm_lib.json_files import parse_object, read_object


#: Longest journal line read: an entry names its chunk and the files it skipped (at most a chunk's files, each
#: with a one-line reason); a longer line is no entry this build wrote.
MAX_JOURNAL_LINE = 4 << 20


class _NotAnEntry(ValueError):
    """A journal line that is not a whole entry."""


def read_journal(partial: Path, chunks: int | None = None) -> tuple[set[int], list[tuple[str, str]]]:
    """Finished chunk ids and the files they skipped. A torn last line (killed mid-write) is ignored, and so is any
    line that is not an entry of this build (garbled, longer than :data:`MAX_JOURNAL_LINE`, nested, of other
    types, or a chunk id outside ``0 .. chunks - 1`` when ``chunks`` is given): its chunk is made again.

    The journal is read line by line, each line bounded, so a huge or hostile file never fills memory.
    """
    done: set[int] = set()
    skipped: list[tuple[str, str]] = []
    journal = partial / JOURNAL
    if not journal.exists():
        return done, skipped
    with open(journal, "rb") as handle:
        while line := handle.readline(MAX_JOURNAL_LINE + 1):
            if len(line) > MAX_JOURNAL_LINE:  # too long for an entry: skip to its end without keeping it
                while line and not line.endswith(b"\n"):
                    line = handle.readline(MAX_JOURNAL_LINE + 1)
                continue
            entry = _journal_entry(line, journal)
            if entry is None or (chunks is not None and entry[0] >= chunks):
                continue
            done.add(entry[0])
            skipped.extend(entry[1])
    return done, skipped


def _journal_entry(line: bytes, journal: Path) -> tuple[int, list[tuple[str, str]]] | None:
    """``(chunk id, [(file, reason), ...])`` of one journal line, or None when it is not a whole entry."""
    try:
        entry = parse_object(line.decode("utf-8", "replace"), journal, _NotAnEntry, max_depth=8,
                             fields={"chunk": int, "skipped": list})
    except _NotAnEntry:
        return None
    chunk, reasons = entry.get("chunk"), entry.get("skipped")
    if chunk is None or reasons is None or chunk < 0:
        return None
    if not all(isinstance(item, list) and len(item) == 2 and all(isinstance(part, str) for part in item)
               for item in reasons):
        return None
    return chunk, [(path, reason) for path, reason in reasons]


#: The files a build writes into its partial folder; "<name>.tmp": one an earlier rpm_lib was killed writing.
_OURS = frozenset({PLAN, JOURNAL, PLAN + ".tmp", MANIFEST, MANIFEST + ".tmp", SKIPPED, "panels.npy", "targets.npy",
                   "meta.npy", "meta.npy.tmp", "meta_target.npy", "valid.npy", "groups.npy", "splits.npy",
                   "file_ids.npy", CACHE_ARRAY})


def _is_ours(name: str) -> bool:
    """Whether ``name`` is a file a build writes, or the temporary file of one (``.<name>.<pid>.tmp``) that a
    kill left before its rename."""
    if name.startswith(".") and name.endswith(TEMP_SUFFIX):
        name = name[1:].rsplit(".", 2)[0]
    return name in _OURS


def remove_partial(partial: Path) -> None:
    """Delete a stale partial build, but only if it looks like one of ours."""
    strangers = [p.name for p in partial.iterdir() if not _is_ours(p.name)]
    if strangers:
        raise DataFormatError(f"{partial}: unexpected files {strangers} in the partial cache folder; remove it by hand")
    shutil.rmtree(partial)


def partial_plan(partial: Path) -> dict | None:
    """The plan an interrupted build was made for: its ``plan.json``, or, once it finished and was killed while
    tidying up (plan gone, manifest written), its manifest's ``plan``; None when neither can be read."""
    for name in (PLAN, MANIFEST):
        try:
            data = read_object(partial / name, _NotAnEntry, fields={"plan": dict} if name == MANIFEST else None)
        except (OSError, _NotAnEntry):
            continue
        if name == MANIFEST:
            data = data.get("plan")
        if isinstance(data, dict):
            return data
    return None


def partial_damage(partial: Path, spec: Kind, plan: dict) -> str | None:
    """Why an interrupted build of ``plan`` cannot be continued, or None: an array missing, unreadable, or not of
    the shape and dtype this version's build makes (one from an older version), or shorter than its shape. A short
    file must never be continued: numpy's ``r+`` memory map pads it with zeros, so the finished rows it lost would
    become zero answers and hashes in a cache that looks whole. A finished build (manifest written) is checked as
    a cache; one whose every chunk is journaled may already have its ``meta.npy`` trimmed to the plain rows."""
    if is_cache(partial):
        try:
            check_cache(partial, read_manifest(partial))
        except DataFormatError as error:
            return str(error)
        return None
    n, size, chunk_size = plan["num_rows"], plan["image_size"], plan["chunk_size"]
    count = -(-n // chunk_size)
    finished = set(range(count)) <= read_journal(partial, count)[0]
    expected = {name: (dtype, {shape}) for name, (dtype, shape) in build_layout(n, size, spec).items()}
    if finished:  # _trim_meta may already have cut meta.npy to the plain rows
        expected["meta.npy"][1].add((n, *spec.meta_shape))
    for name, (dtype, shapes) in expected.items():
        file = partial / name
        if not file.is_file():
            return f"{name}: missing"
        try:
            shape, found, offset = array_header(file)
        except (OSError, ValueError, EOFError) as error:
            return f"{name}: not a readable .npy array ({str(error).splitlines()[0]})"
        if tuple(shape) not in shapes or found != np.dtype(dtype):
            return f"{name}: {found} {tuple(shape)}, not what this build makes"
        needed = offset + int(np.prod(tuple(shape), dtype=np.int64)) * found.itemsize
        if file.stat().st_size < needed:
            return f"{name}: truncated to {file.stat().st_size} of its {needed} bytes"
    return None
