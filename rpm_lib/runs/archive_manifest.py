"""What an ``rpm-batch pack`` archive is, and the checked reading of one: its manifest, member names and limits.

An archive is a gzip tar whose first member is ``rpm_state.json`` (format, version, the runs, and each file's size
and SHA-256), followed by the files of its run folders under their run-folder paths. Archives travel between
machines and people, so reading one checks everything before it is trusted: the manifest's shape and limits
(:data:`MAX_FILE_BYTES`, :data:`MAX_TOTAL_BYTES`) before any data are read, then every member, streamed: a name of
a run-state file (:func:`split_name`), passed by tarfile's ``data`` extraction filter (``tarfile.data_filter``:
no absolute path, nothing outside the destination, no links out, no special files), a regular file, listed in the
manifest with its size, and matching its SHA-256. Packing is ``rpm_lib.runs.archive_pack``; unpacking
``rpm_lib.runs.archive``.
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rpm_lib.json_files import parse_object, printable, shown_value
from rpm_lib.run_folder import (CHECKPOINTS, CONFIG, FINAL_WEIGHTS, HISTORY, METRICS, PREDICTIONS_GLOB, PROGRESS,
                                RUN_RECORD)
from rpm_lib.training.setups import STAGES

#: The archive's own record: format, version, runs, files with their sizes and SHA-256. Always its first member,
#: so that reading it never scans (or decompresses) the rest.
MANIFEST = "rpm_state.json"
FORMAT = "rpm_lib-run-state"
VERSION = 1
#: Files of a run folder that always travel (when present).
RUN_FILES: tuple[str, ...] = (CONFIG, PROGRESS, HISTORY, RUN_RECORD)
#: Files of a finished run that travel (besides RUN_FILES): its metrics and the bfloat16 weights its test scored.
RESULT_FILES: tuple[str, ...] = (METRICS, FINAL_WEIGHTS)
RESULT_GLOB = PREDICTIONS_GLOB
#: The checkpoints of a stage (``checkpoints/<stage>/``) that travel.
CHECKPOINT_NAMES: tuple[str, ...] = ("last.ckpt", "best.ckpt")
#: Names a run folder's file may have in an archive (checked on unpack).
ALLOWED = re.compile("(" + "|".join(re.escape(name) for name in (*RUN_FILES, *RESULT_FILES))
                     + r"|predictions[A-Za-z0-9_.-]*\.npz"
                     + rf"|{re.escape(CHECKPOINTS)}/({'|'.join(STAGES)})/(last|best)\.ckpt)")
#: Largest file accepted on unpack (a checkpoint of the largest encoder with Adam state is ~160 MB).
MAX_FILE_BYTES = 1 << 30
#: Largest total of an archive's files accepted on unpack, declared in its manifest and checked before any data
#: are read: a run's state is normally MBs (8-11 MB per unfinished SCL run packed with --compact), and this
#: leaves room for a few dozen unfinished runs of the largest encoder, while a small archive of zeros can no
#: longer fill the disk.
MAX_TOTAL_BYTES = 4 << 30
#: Largest manifest accepted (about 10 entries of ~150 bytes per run: room for tens of thousands of runs).
MAX_MANIFEST_BYTES = 16 << 20
#: Largest tar header extension accepted (a long name, a pax header): tarfile reads one whole into memory.
MAX_HEADER_BYTES = 1 << 20
#: Longest member name accepted (a run folder's path inside the packed folder and the file's name in it): far
#: beyond any batch's, and short enough for every file system's path limit below the folder unpacked into.
MAX_NAME_CHARS = 1024
#: Bytes read at a time while members are hashed and written.
_CHUNK = 1 << 20
#: What reading a damaged or foreign archive raises (gzip.BadGzipFile is an OSError).
_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _named(name: str) -> str:
    """A member's name as messages show it: quoted, control characters escaped, at most 200 characters."""
    return shown_value(name, 200)


class ArchiveError(ValueError):
    """A run folder cannot be packed, or an archive is malformed or unsafe; the message names the file."""


def split_name(name: str, source: Path) -> tuple[str, str]:
    """(run folder, name inside it) of archive member ``name``; refuses unsafe or non-run-state names.

    The run folder is ``.`` for an archive of one run folder, as ``pack`` records it. A name is at most
    :data:`MAX_NAME_CHARS` characters long. The manifest's names are
    checked here before any member is read; members are also passed through tarfile's ``data`` filter
    (:func:`read_members`).
    """
    if len(name) > MAX_NAME_CHARS:
        # before any parsing: every later step (the folders made, the links looked for) walks the name's depth
        raise ArchiveError(f"{source}: member name {_named(name)} has {len(name)} characters (at most "
                           f"{MAX_NAME_CHARS}); refusing to unpack")
    path = PurePosixPath(name)
    # Only the canonical spelling: "run/./x" or "run//x" would name the same file as another member.
    # No control characters either: names are printed (a terminal escape sequence in a run folder's name).
    if (path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts or path.as_posix() != name
            or not name.isprintable()):
        raise ArchiveError(f"{source}: unsafe member name {_named(name)}; refusing to unpack")
    parts = path.parts
    for cut in (len(parts) - 3, len(parts) - 1):  # checkpoints/<stage>/<file>, or a file directly in the run folder
        if cut >= 0 and ALLOWED.fullmatch("/".join(parts[cut:])):
            return "/".join(parts[:cut]) or ".", "/".join(parts[cut:])
    raise ArchiveError(f"{source}: member {_named(name)} is not a run-state file; refusing to unpack")


def read_manifest(source: str | Path) -> dict[str, Any]:
    """The ``rpm_state.json`` of an archive, checked to be this format and of the right shape."""
    source = Path(source)
    with _reading(source) as archive:
        return _manifest(archive, source, MAX_TOTAL_BYTES)


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header that refuses what tarfile would otherwise read whole into memory, before any name is seen: a
    header extension (GNU long name, pax header) over :data:`MAX_HEADER_BYTES`, or a GNU sparse member (a chain
    of headers of any length). pack writes neither."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.ReadError(f"member {_named(self.name)} is a sparse file")
        if self.type in _EXTENSIONS and self.size > MAX_HEADER_BYTES:
            raise tarfile.ReadError(f"a header extension of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(archive)  # type: ignore[misc]


_EXTENSIONS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
               tarfile.SOLARIS_XHDTYPE)


@contextlib.contextmanager
def _reading(source: Path) -> Iterator[tarfile.TarFile]:
    """``source`` opened for reading its members in order (each read in chunks, so memory stays small whatever a
    member holds), its read errors as one line."""
    if not source.is_file():
        raise ArchiveError(f"{source}: no such archive")
    try:
        archive = tarfile.open(source, "r:*", tarinfo=_BoundedTarInfo)
    except _TAR_ERRORS as error:
        # tarfile's message lists every format it tried, one per line
        why = "empty file" if source.stat().st_size == 0 else f"neither gzip nor tar data: {type(error).__name__}"
        raise ArchiveError(f"{source}: not a readable tar archive ({why})") from None
    try:
        with archive:
            yield archive
    except _TAR_ERRORS as error:
        why = " ".join(str(error).split()) or type(error).__name__
        raise ArchiveError(f"{source}: a damaged tar archive ({why})") from None


def _manifest(archive: tarfile.TarFile, source: Path, max_total_bytes: int) -> dict[str, Any]:
    """The manifest, read from the first member; every field checked (see :func:`_check_manifest`)."""
    member = archive.next()
    if member is None or member.name != MANIFEST or not member.isreg() or member.size > MAX_MANIFEST_BYTES:
        raise ArchiveError(f"{source}: does not begin with a readable {MANIFEST}; not an rpm-batch pack archive")
    handle = archive.extractfile(member)
    data = handle.read() if handle is not None else b""  # member.size <= MAX_MANIFEST_BYTES (above)
    # bounded: at most MAX_MANIFEST_BYTES (above), nested at most json_files.MAX_DEPTH deep, no key twice
    manifest = parse_object(data, f"{source}: {MANIFEST}", ArchiveError, "not an rpm-batch pack archive")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ArchiveError(f"{source}: {MANIFEST} is not format {FORMAT} version {VERSION}")
    _check_manifest(manifest, source, max_total_bytes)
    # only informs (``rpm-batch unpack`` prints it): any other text is shown, escaped and cut, never refused
    created = manifest.get("created")
    manifest["created"] = printable(created) if isinstance(created, str) else "?"
    return manifest


def _check_manifest(manifest: dict[str, Any], source: Path, max_total_bytes: int) -> None:
    """Refuse a manifest whose ``files`` or ``runs`` would make unpacking unsafe or its report wrong.

    ``files`` maps run-state names (:func:`split_name`) to ``{"bytes", "sha256"}``, none below another (a file
    cannot also be a folder), within :data:`MAX_FILE_BYTES` each and ``max_total_bytes`` together, each run folder's
    ``config.yaml`` among them; ``runs`` lists exactly the run folders those files lie in.
    """
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArchiveError(f"{source}: {MANIFEST} has no 'files' mapping")
    total = 0
    folders: set[str] = set()
    configured: set[str] = set()
    for name, record in files.items():
        folder, inside = split_name(name, source)
        folders.add(folder)
        if inside == CONFIG:
            configured.add(folder)
        size = record.get("bytes") if isinstance(record, dict) else None
        if (not isinstance(record, dict) or not isinstance(record.get("sha256"), str)
                or not _SHA256.fullmatch(record["sha256"]) or not isinstance(size, int) or isinstance(size, bool)
                or size < 0):
            raise ArchiveError(f"{source}: {MANIFEST}: files[{_named(name)}] must be {{\"bytes\": <count>, \"sha256\": "
                               "<64 hex digits>}")
        if size > MAX_FILE_BYTES:
            raise ArchiveError(f"{source}: member {_named(name)} is {size} bytes (at most {MAX_FILE_BYTES}); refusing "
                               "to unpack")
        total += size
    if total > max_total_bytes:
        raise ArchiveError(f"{source}: its files hold {total} bytes (at most {max_total_bytes}); refusing to unpack")
    # A name's folders are the names that begin with it and a "/"; in sorted order they follow it at once. Looked
    # up by bisection, not by listing each name's parents: that cost the square of a name's depth.
    ordered = sorted(files)
    for name in files:
        place = bisect.bisect_left(ordered, name + "/")
        if place < len(ordered) and ordered[place].startswith(name + "/"):
            raise ArchiveError(f"{source}: member {_named(ordered[place])} lies below member {_named(name)}; "
                               "refusing to unpack")
    runs = manifest.get("runs")
    if (not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("path"), str) for r in runs)
            or sorted(r["path"] for r in runs) != sorted(folders)):
        raise ArchiveError(f"{source}: {MANIFEST}: 'runs' must list each run folder of its files once "
                           f"({len(folders)} folder(s)); damaged or altered archive")
    # pack packs a run only with its config.yaml: without it, unpack --overwrite would leave the config of the run
    # it replaces beside this run's resume point, and nothing could tell which settings that state trained with.
    unconfigured = sorted(folders - configured)
    if unconfigured:
        raise ArchiveError(f"{source}: run {_named(unconfigured[0])} has no {CONFIG} (pack never leaves it out, and "
                           "a run state without its config cannot be resumed safely); damaged or altered archive; "
                           "refusing to unpack")


def _check_member(member: tarfile.TarInfo, source: Path, dest: str) -> None:
    """Refuse a member that tarfile's ``data`` extraction filter refuses or renames for ``dest`` (an absolute name,
    a place outside ``dest``, also through a symbolic link already there; a link out; a special file), or that is
    anything but a regular file (the filter lets links inside ``dest`` and folders pass; an archive of run state
    holds files only). Its permissions are never applied: unpacked files get the ordinary ones of new files."""
    name = member.name
    try:
        filtered = tarfile.data_filter(member, dest)
    except tarfile.OutsideDestinationError:
        # a name that stays inside lexically (split_name) resolves outside: a symbolic link already in ``dest``
        where = os.path.realpath(os.path.join(dest, name))
        raise ArchiveError(f"{source}: unsafe member name {_named(name)} (it would be written to {where}, outside "
                           f"{dest}); refusing to unpack") from None
    except tarfile.AbsolutePathError:
        raise ArchiveError(f"{source}: unsafe member name {_named(name)}; refusing to unpack") from None
    except tarfile.FilterError:
        raise ArchiveError(f"{source}: member {_named(name)} is not a regular file; refusing to unpack") from None
    if filtered.name != name:  # the filter strips a leading "/": an absolute name
        raise ArchiveError(f"{source}: unsafe member name {_named(name)}; refusing to unpack")
    if not member.isreg():
        raise ArchiveError(f"{source}: member {_named(name)} is not a regular file; refusing to unpack")


def read_members(source: Path, dest: str | os.PathLike, sink: Callable[[str], IO[bytes]] | None = None,
                 max_total_bytes: int = MAX_TOTAL_BYTES) -> dict[str, Any]:
    """Read archive ``source`` through, checking its manifest and every member against it; returns the manifest.

    Members are streamed in chunks, never held whole; each is checked for unpacking under ``dest`` (see
    :func:`_check_member`), hashed and, with ``sink``, written to ``sink(name)`` as it goes (the caller discards
    what was written when this raises).

    Raises:
        ArchiveError: see ``rpm_lib.runs.archive.unpack``.
        WriteFailed: ``sink`` could not be opened, written or closed.
    """
    dest = os.fspath(dest)
    with _reading(source) as archive:
        manifest = _manifest(archive, source, max_total_bytes)
        expected: dict[str, dict[str, Any]] = manifest["files"]
        seen: set[str] = set()
        while (member := archive.next()) is not None:
            name = member.name
            if name == MANIFEST or name in seen:
                raise ArchiveError(f"{source}: member {_named(name)} appears twice; refusing to unpack")
            split_name(name, source)
            _check_member(member, source, dest)
            if name not in expected:
                raise ArchiveError(f"{source}: member {_named(name)} is not listed in {MANIFEST} (damaged or altered "
                                   "archive); refusing to unpack")
            if member.size != expected[name]["bytes"]:
                raise ArchiveError(f"{source}: member {_named(name)} is {member.size} bytes, {MANIFEST} says "
                                   f"{expected[name]['bytes']} (damaged or altered archive)")
            seen.add(name)
            handle = archive.extractfile(member) or io.BytesIO()
            digest = hashlib.sha256()
            with _writing(sink, name) as write:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                    write(chunk)
            if digest.hexdigest() != expected[name]["sha256"]:
                raise ArchiveError(f"{source}: member {_named(name)} does not match its SHA-256 in {MANIFEST} "
                                   "(damaged or altered archive)")
        missing = sorted(set(expected) - seen)
        if missing:
            raise ArchiveError(f"{source}: {len(missing)} file(s) listed in {MANIFEST} are missing, e.g. {missing[0]}")
    return manifest


class WriteFailed(Exception):
    """An ``OSError`` of writing a member (disk full, permissions), kept apart from the archive's read errors."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _writing(sink: Callable[[str], IO[bytes]] | None, name: str) -> Iterator[Callable[[bytes], Any]]:
    """A function that writes a chunk of member ``name`` to ``sink(name)`` (or discards it without a sink).

    Only the sink's own errors become :class:`WriteFailed`: the archive's read errors raised while it is open
    pass unchanged."""
    if sink is None:
        yield lambda chunk: None
        return
    try:
        output = sink(name)
    except OSError as error:
        raise WriteFailed(error) from None

    def write(chunk: bytes) -> None:
        try:
            output.write(chunk)
        except OSError as error:
            raise WriteFailed(error) from None

    try:
        yield write
    finally:
        try:
            output.close()
        except OSError as error:
            raise WriteFailed(error) from None
