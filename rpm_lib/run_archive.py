"""Portable run state: pack what resuming needs from run folders into one small archive, and unpack it elsewhere.

``rpm-batch pack DIR --out state.tar.gz`` packs every run folder under ``DIR`` (a batch folder, or one run
folder); ``rpm-batch unpack state.tar.gz --out DIR`` restores them, on this machine or another. Resume there
with ``resume=true`` once the data are regenerated (the run refuses data whose fingerprint differs from the one
in its ``progress.json``).

A run folder is a folder with ``config.yaml`` and a record of progress: ``progress.json``, ``metrics.json``,
``history.csv`` or a stage's ``last.ckpt`` -- a run killed in its first stage (SIGKILL, the out-of-memory killer)
has the last two and a ``progress.json`` with only its data's fingerprint (runs before 2026-11-27: none), and
resumes from that ``last.ckpt`` like any other. What it contributes (everything
else -- executed notebooks, figures, logs -- stays behind):

* always: ``config.yaml``, ``progress.json``, ``history.csv``, ``run.json`` (rpm-batch's record of the run);
* a finished run (``metrics.json``): ``metrics.json`` and ``predictions*.npz``; its final weights only with
  ``keep_final_weights`` (resuming never needs them);
* an unfinished run: each finished stage's chosen weights, and of the stage in progress (the one
  ``progress.json`` marks unfinished, or a killed run's stage that it has no entry for yet) its ``last.ckpt``
  (weights, optimiser, loop and callback state: the exact resume point) and its ``best.ckpt`` -- the latter two
  reduced to the model weights where that is all the run reads back (``restore_best`` and finished stages only
  read ``state_dict``).

``compact=True`` (``rpm-batch pack --compact``) also stores the Adam moments of ``last.ckpt`` in bfloat16 (PyTorch
casts them back to the parameters' dtype when the optimiser loads them): 12 instead of 16 bytes per parameter
of an unfinished run, at the price of bit-exactness -- for GPU campaigns, whose runs are not bit-exact anyway.
Weights are never rounded. ``--out`` replaces an archive written here (a campaign re-packs every slice), never
another file. A symbolic link in a run folder, or a run folder that is one, is refused: an archive is made to be
shared, and must not carry a file from outside the packed folder.

Unpacking is for files from elsewhere, so the whole archive is checked before anything is written: its
``rpm_state.json`` first (shape, a SHA-256 and size per file, at most :data:`MAX_TOTAL_BYTES` in all), then
every member, streamed (never held in memory): only regular files with the names above, below a run folder, no
absolute paths, no ``..``, no links, none below another member's path, each matching its SHA-256. Existing
run files are never replaced unless asked; with ``overwrite`` a run already there is replaced as a whole (its
progress records, results and checkpoints that the archive does not carry are removed, so none contradicts the
restored state), and a run that had gone further than the archive's is named in a warning; a run still training
there (its ``RUN_LOCK`` held) is refused. Checkpoints are plain
tensors, read with ``torch.load(weights_only=True)`` when resumed, so an archive cannot run code.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import filecmp
import hashlib
import io
import json
import re
import shutil
import sys
import tarfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rpm_lib.checkpoints import load_plain
from rpm_lib.json_files import read_object, read_object_or_empty
from rpm_lib.run_progress import FINISHED, RUN_LOCK, UNFINISHED, recorded_weights, weights_record
from rpm_lib.training.history import history_rows
from rpm_lib.training.setups import STAGES

#: The archive's own record: format, version, runs, files with their sizes and SHA-256. Always its first member,
#: so that reading it never scans (or decompresses) the rest.
MANIFEST = "rpm_state.json"
FORMAT = "rpm_lib-run-state"
VERSION = 1
#: Files of a run folder that always travel (when present).
RUN_FILES: tuple[str, ...] = ("config.yaml", "progress.json", "history.csv", "run.json")
#: Files of a finished run that travel (besides RUN_FILES).
RESULT_FILES: tuple[str, ...] = ("metrics.json",)
RESULT_GLOB = "predictions*.npz"
#: The checkpoints of a stage (``checkpoints/<stage>/``) that travel.
CHECKPOINT_NAMES: tuple[str, ...] = ("last.ckpt", "best.ckpt")
#: Names a run folder's file may have in an archive (checked on unpack).
_ALLOWED = re.compile(r"(config\.yaml|progress\.json|history\.csv|run\.json|metrics\.json|predictions[A-Za-z0-9_.-]*"
                      rf"\.npz|checkpoints/({'|'.join(STAGES)})/(last|best)\.ckpt)")
#: Files of a run folder that describe the run rather than say how far it got: the only ones a run replaced by
#: ``unpack(overwrite=True)`` keeps when the archive does not carry them.
_DESCRIPTIONS: tuple[str, ...] = ("config.yaml", "run.json")
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
#: Bytes read at a time while members are hashed and written.
_CHUNK = 1 << 20
#: What reading a damaged or foreign archive raises (gzip.BadGzipFile is an OSError).
_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ArchiveError(ValueError):
    """A run folder cannot be packed, or an archive is malformed or unsafe; the message names the file."""


@dataclasses.dataclass
class PackedRun:
    """One run in an archive: its folder (relative to the packed folder), status and bytes packed."""

    path: str
    status: str
    files: list[str]
    bytes: int


def find_runs(folder: str | Path) -> list[Path]:
    """Run folders at or below ``folder``: folders holding ``config.yaml`` and a record of progress (see the module
    docstring; a folder with only ``config.yaml`` has not started, so there is nothing to resume)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArchiveError(f"{folder}: not a folder")
    candidates = [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]
    return [p for p in candidates if (p / "config.yaml").is_file() and _has_progress(p)]


def _has_progress(run_dir: Path) -> bool:
    return (any((run_dir / name).is_file() for name in ("progress.json", "metrics.json", "history.csv"))
            or any((run_dir / "checkpoints" / stage / "last.ckpt").is_file() for stage in STAGES))


def run_status(run_dir: Path) -> str:
    """``finished`` (metrics.json) or ``unfinished`` (to be resumed: stopped by a budget, or killed)."""
    return FINISHED if (run_dir / "metrics.json").is_file() else UNFINISHED


def _read_json(path: Path) -> dict[str, Any]:
    return read_object(path, ArchiveError, missing_ok=True)


def _weights_only(path: Path) -> bytes:
    """The model weights of a Lightning checkpoint, re-saved as ``{"state_dict": ...}`` (plain tensors)."""
    import torch

    buffer = io.BytesIO()
    torch.save({"state_dict": load_plain(path, ArchiveError)["state_dict"]}, buffer)
    return buffer.getvalue()


#: Optimiser-state entries ``compact`` stores in bfloat16 (Adam's first and second moments).
COMPACT_STATE_KEYS: frozenset[str] = frozenset({"exp_avg", "exp_avg_sq"})


def _compact_checkpoint(path: Path) -> bytes:
    """A Lightning checkpoint with its Adam moments in bfloat16 (everything else unchanged)."""
    import torch

    checkpoint = load_plain(path, ArchiveError)
    for optimizer in checkpoint.get("optimizer_states", []):
        for state in optimizer.get("state", {}).values():
            for key in COMPACT_STATE_KEYS & set(state):
                if state[key].is_floating_point():
                    state[key] = state[key].to(torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def _refuse_links(top: Path, path: Path) -> None:
    """Refuse ``path`` when it, or a folder between ``top`` and it, is a symbolic link.

    An archive is made to be shared: a link in a run folder (``history.csv -> ~/.netrc``, a run folder linked in
    from elsewhere) put the bytes of a file outside the packed folder into it.

    Raises:
        ArchiveError: naming the link.
    """
    for place in [path, *path.parents]:
        if place == top or top not in place.parents:
            return
        if place.is_symlink():
            raise ArchiveError(f"{place}: a symbolic link; pack copies only files that lie inside the packed folder "
                               "(replace the link by a copy of its target, or pack the target's folder)")


def _run_members(run_dir: Path, keep_final_weights: bool, compact: bool = False) -> list[tuple[str, bytes]]:
    """(name inside the run folder, content) of what resuming ``run_dir`` needs (see the module docstring)."""
    status = run_status(run_dir)
    members: list[tuple[str, bytes]] = []
    names = list(RUN_FILES)
    if status == FINISHED:
        names += list(RESULT_FILES) + sorted(p.name for p in run_dir.glob(RESULT_GLOB))
    for name in [*names, *(f"checkpoints/{stage}/{ckpt}" for stage in STAGES for ckpt in CHECKPOINT_NAMES)]:
        _refuse_links(run_dir, run_dir / name)
    for name in names:
        if (run_dir / name).is_file():
            members.append((name, (run_dir / name).read_bytes()))
    stages = _read_json(run_dir / "progress.json").get("stages", {})
    if not isinstance(stages, dict):
        raise ArchiveError(f"{run_dir / 'progress.json'}: field 'stages' is not a mapping")
    if status == FINISHED:
        if keep_final_weights and stages:
            final = recorded_weights(run_dir, list(stages.values())[-1].get("weights"))
            if final is not None and final.is_file():
                members.append((weights_record(run_dir, final), _weights_only(final)))
        return members
    completed = set()
    for name, summary in stages.items():
        if not isinstance(summary, dict):
            raise ArchiveError(f"{run_dir / 'progress.json'}: stage {name!r} is not a mapping")
        if not summary.get("completed"):
            continue
        completed.add(name)
        if summary.get("skipped"):
            continue  # the epochs of the stages before it left it none: it trained nothing
        weights = recorded_weights(run_dir, summary.get("weights"))
        if weights is None or not weights.is_file():
            raise ArchiveError(f"{run_dir}: finished stage {name} names weights {summary.get('weights')!r}, "
                               "which are missing or outside the run folder")
        members.append((weights_record(run_dir, weights), _weights_only(weights)))
    # The stage in progress: the one progress.json marks unfinished (a time budget stopped it) or, in a killed run,
    # one it has no entry for yet (stages enter progress.json when they end): its checkpoints are the resume point.
    for name in STAGES:
        stage_dir = run_dir / "checkpoints" / name
        if name in completed:
            continue
        last = stage_dir / "last.ckpt"
        if last.is_file():
            members.append((f"checkpoints/{name}/last.ckpt",
                            _compact_checkpoint(last) if compact else last.read_bytes()))
        if (stage_dir / "best.ckpt").is_file():
            members.append((f"checkpoints/{name}/best.ckpt", _weights_only(stage_dir / "best.ckpt")))
    # A finished stage whose recorded weights are its last.ckpt is packed once.
    return list(dict(members).items())


def pack(folder: str | Path, out: str | Path, keep_final_weights: bool = False,
         compact: bool = False) -> list[PackedRun]:
    """Pack every run folder at or below ``folder`` into the gzip tar ``out`` (written atomically).

    ``out`` may replace an archive written here (the normal workflow: a campaign re-packs its state every slice),
    never another file or a folder.

    Returns:
        One :class:`PackedRun` per run, in folder order.

    Raises:
        ArchiveError: no run folder found, a run folder that names missing weights, or an ``out`` that is a
            folder, another file, or cannot be written. Nothing is left behind at ``out`` then.
    """
    folder, out = Path(folder), Path(out)
    _check_pack_out(out)
    runs = find_runs(folder)
    if not runs:
        raise ArchiveError(f"{folder}: no run folders (a folder with config.yaml and progress.json, metrics.json, "
                           "history.csv or checkpoints/<stage>/last.ckpt)")
    packed: list[PackedRun] = []
    files: dict[str, dict[str, Any]] = {}
    contents: list[tuple[str, bytes]] = []
    for run_dir in runs:
        _refuse_links(folder, run_dir)
        relative = run_dir.relative_to(folder).as_posix()
        members = _run_members(run_dir, keep_final_weights, compact)
        for name, data in members:
            arcname = name if relative == "." else f"{relative}/{name}"
            files[arcname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            contents.append((arcname, data))
        packed.append(PackedRun(relative, run_status(run_dir), [n for n, _ in members],
                                sum(len(d) for _, d in members)))
    manifest = {"format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "compact": compact, "runs": [dataclasses.asdict(p) for p in packed], "files": files}
    partial = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
            _add(archive, MANIFEST, json.dumps(manifest, indent=1).encode())
            for arcname, data in contents:
                _add(archive, arcname, data)
        partial.replace(out)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise ArchiveError(f"{out}: cannot write the archive ({error.strerror or error})") from None
    return packed


def _check_pack_out(out: Path) -> None:
    """Refuse an ``out`` that is a folder, or a file other than an archive written here (checked before packing)."""
    if out.is_dir():
        raise ArchiveError(f"{out}: is a folder; --out names the archive file to write (e.g. {out / 'state.tar.gz'})")
    if out.exists() or out.is_symlink():
        try:
            read_manifest(out)
        except ArchiveError:
            raise ArchiveError(f"{out}: exists and is not an archive written by rpm-batch pack; refusing to replace "
                               "it (remove it or choose another --out)") from None


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same state packs to the same bytes
    archive.addfile(info, io.BytesIO(data))


def _split_name(name: str, source: Path) -> tuple[str, str]:
    """(run folder, name inside it) of archive member ``name``; refuses unsafe or non-run-state names.

    The run folder is ``.`` for an archive of one run folder, as :func:`pack` records it.
    """
    path = PurePosixPath(name)
    # Only the canonical spelling: "run/./x" or "run//x" would name the same file as another member.
    if path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts or path.as_posix() != name:
        raise ArchiveError(f"{source}: unsafe member name {name!r}; refusing to unpack")
    parts = path.parts
    for cut in (len(parts) - 3, len(parts) - 1):  # checkpoints/<stage>/<file>, or a file directly in the run folder
        if cut >= 0 and _ALLOWED.fullmatch("/".join(parts[cut:])):
            return "/".join(parts[:cut]) or ".", "/".join(parts[cut:])
    raise ArchiveError(f"{source}: member {name!r} is not a run-state file; refusing to unpack")


def read_manifest(source: str | Path) -> dict[str, Any]:
    """The ``rpm_state.json`` of an archive, checked to be this format and of the right shape."""
    source = Path(source)
    with _reading(source) as archive:
        return _manifest(archive, source)


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header that refuses what tarfile would otherwise read whole into memory, before any name is seen: a
    header extension (GNU long name, pax header) over :data:`MAX_HEADER_BYTES`, or a GNU sparse member (a chain
    of headers of any length). pack writes neither."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.ReadError(f"member {self.name!r} is a sparse file")
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


def _manifest(archive: tarfile.TarFile, source: Path) -> dict[str, Any]:
    """The manifest, read from the first member; every field checked (see :func:`_check_manifest`)."""
    member = archive.next()
    if member is None or member.name != MANIFEST or not member.isreg() or member.size > MAX_MANIFEST_BYTES:
        raise ArchiveError(f"{source}: does not begin with a readable {MANIFEST}; not an rpm-batch pack archive")
    handle = archive.extractfile(member)
    try:
        manifest = json.loads(handle.read() if handle is not None else b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArchiveError(f"{source}: no readable {MANIFEST} ({type(error).__name__}); not an rpm-batch pack "
                           "archive") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ArchiveError(f"{source}: {MANIFEST} is not format {FORMAT} version {VERSION}")
    _check_manifest(manifest, source)
    return manifest


def _check_manifest(manifest: dict[str, Any], source: Path) -> None:
    """Refuse a manifest whose ``files`` or ``runs`` would make unpacking unsafe or its report wrong.

    ``files`` maps run-state names (:func:`_split_name`) to ``{"bytes", "sha256"}``, none below another (a file
    cannot also be a folder), within :data:`MAX_FILE_BYTES` each and :data:`MAX_TOTAL_BYTES` together;
    ``runs`` lists exactly the run folders those files lie in.
    """
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArchiveError(f"{source}: {MANIFEST} has no 'files' mapping")
    total = 0
    folders = set()
    for name, record in files.items():
        folders.add(_split_name(name, source)[0])
        size = record.get("bytes") if isinstance(record, dict) else None
        if (not isinstance(record, dict) or not isinstance(record.get("sha256"), str)
                or not _SHA256.fullmatch(record["sha256"]) or not isinstance(size, int) or isinstance(size, bool)
                or size < 0):
            raise ArchiveError(f"{source}: {MANIFEST}: files[{name!r}] must be {{\"bytes\": <count>, \"sha256\": "
                               "<64 hex digits>}")
        if size > MAX_FILE_BYTES:
            raise ArchiveError(f"{source}: member {name!r} is {size} bytes (at most {MAX_FILE_BYTES}); refusing to "
                               "unpack")
        total += size
    if total > MAX_TOTAL_BYTES:
        raise ArchiveError(f"{source}: its files hold {total} bytes (at most {MAX_TOTAL_BYTES}); refusing to unpack")
    for name in files:
        above = next((str(p) for p in PurePosixPath(name).parents if str(p) in files), None)
        if above is not None:
            raise ArchiveError(f"{source}: member {name!r} lies below member {above!r}; refusing to unpack")
    runs = manifest.get("runs")
    if (not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("path"), str) for r in runs)
            or sorted(r["path"] for r in runs) != sorted(folders)):
        raise ArchiveError(f"{source}: {MANIFEST}: 'runs' must list each run folder of its files once "
                           f"({len(folders)} folder(s)); damaged or altered archive")


def _files(source: Path, sink: Callable[[str], IO[bytes]] | None = None) -> dict[str, Any]:
    """Read archive ``source`` through, checking its manifest and every member against it; returns the manifest.

    Members are streamed in chunks, never held whole; each is hashed and, with ``sink``, written to
    ``sink(name)`` as it goes (the caller discards what was written when this raises).

    Raises:
        ArchiveError: see :func:`unpack`.
    """
    with _reading(source) as archive:
        manifest = _manifest(archive, source)
        expected: dict[str, dict[str, Any]] = manifest["files"]
        seen: set[str] = set()
        while (member := archive.next()) is not None:
            name = member.name
            if name == MANIFEST or name in seen:
                raise ArchiveError(f"{source}: member {name!r} appears twice; refusing to unpack")
            _split_name(name, source)
            if not member.isreg():
                raise ArchiveError(f"{source}: member {name!r} is not a regular file; refusing to unpack")
            if name not in expected:
                raise ArchiveError(f"{source}: member {name!r} is not listed in {MANIFEST} (damaged or altered "
                                   "archive); refusing to unpack")
            if member.size != expected[name]["bytes"]:
                raise ArchiveError(f"{source}: member {name!r} is {member.size} bytes, {MANIFEST} says "
                                   f"{expected[name]['bytes']} (damaged or altered archive)")
            seen.add(name)
            handle = archive.extractfile(member) or io.BytesIO()
            digest = hashlib.sha256()
            with _writing(sink, name) as write:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                    write(chunk)
            if digest.hexdigest() != expected[name]["sha256"]:
                raise ArchiveError(f"{source}: member {name!r} does not match its SHA-256 in {MANIFEST} "
                                   "(damaged or altered archive)")
        missing = sorted(set(expected) - seen)
        if missing:
            raise ArchiveError(f"{source}: {len(missing)} file(s) listed in {MANIFEST} are missing, e.g. {missing[0]}")
    return manifest


class _WriteFailed(Exception):
    """An ``OSError`` of writing a member (disk full, permissions), kept apart from the archive's read errors."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _writing(sink: Callable[[str], IO[bytes]] | None, name: str) -> Iterator[Callable[[bytes], Any]]:
    """A function that writes a chunk of member ``name`` to ``sink(name)`` (or discards it without a sink).

    Only the sink's own errors become :class:`_WriteFailed`: the archive's read errors raised while it is open
    pass unchanged."""
    if sink is None:
        yield lambda chunk: None
        return
    try:
        output = sink(name)
    except OSError as error:
        raise _WriteFailed(error) from None

    def write(chunk: bytes) -> None:
        try:
            output.write(chunk)
        except OSError as error:
            raise _WriteFailed(error) from None

    try:
        yield write
    finally:
        try:
            output.close()
        except OSError as error:
            raise _WriteFailed(error) from None


def _state_files(run_dir: Path) -> list[Path]:
    """Files of ``run_dir`` that say how far its run got (progress, history, results, checkpoints): what a run
    restored over it must not keep, since they would contradict the restored state."""
    if not run_dir.is_dir():
        return []
    names = [n for n in (*RUN_FILES, *RESULT_FILES) if n not in _DESCRIPTIONS]
    names += sorted(p.name for p in run_dir.glob(RESULT_GLOB))
    names += [f"checkpoints/{stage}/{name}" for stage in STAGES for name in CHECKPOINT_NAMES]
    return [run_dir / name for name in names if _ALLOWED.fullmatch(name) and (run_dir / name).is_file()]


def _check_target(out: Path, name: str) -> Path:
    """Where member ``name`` goes under ``out``; refuses a place taken by something other than a regular file,
    or below one."""
    target = out.joinpath(*PurePosixPath(name).parts)
    for folder in reversed(target.relative_to(out).parents[:-1]):
        place = out / folder
        if place.exists() and not place.is_dir():
            raise ArchiveError(f"{place} exists and is not a folder (the archive has {name} below it); refusing to "
                               "unpack")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise ArchiveError(f"{target} exists and is not a regular file; refusing to unpack over it")
    return target


@dataclasses.dataclass(frozen=True)
class _Reach:
    """How far a run got: finished (``metrics.json``), optimiser steps (``progress.json``), epochs (``history.csv``)."""

    finished: bool
    steps: int
    epochs: int

    def beyond(self, other: _Reach) -> bool:
        return (self.finished and not other.finished) or self.steps > other.steps or self.epochs > other.epochs

    def __str__(self) -> str:
        return f"{FINISHED if self.finished else UNFINISHED}, {self.steps} steps, {self.epochs} epochs"


#: The records that say how far a run got (and, all three the same, that two folders hold the same state).
_RECORDS: tuple[str, ...] = ("progress.json", "history.csv", "metrics.json")


def _reach(records: dict[str, Path | None]) -> _Reach:
    """The :class:`_Reach` of a run from its :data:`_RECORDS` (name -> file, None where it has none); damaged
    records count as nothing (this only informs a warning)."""
    progress, history, metrics = (records[name] for name in _RECORDS)
    stages = read_object_or_empty(progress).get("stages") if progress is not None else None
    try:
        steps = sum(int(s.get("global_step") or 0) for s in stages.values() if isinstance(s, dict))
    except (AttributeError, TypeError, ValueError):
        steps = 0
    try:
        epochs = len(history_rows(history)) if history is not None else 0
    except (OSError, ValueError, UnicodeDecodeError, csv.Error):
        epochs = 0
    return _Reach(metrics is not None and metrics.is_file(), steps, epochs)


def run_reach(run_dir: str | Path) -> _Reach:
    """How far the run in ``run_dir`` got (finished, optimiser steps, epochs), from its records; ``a.beyond(b)``
    says whether one run folder holds work that another lacks."""
    run_dir = Path(run_dir)
    return _reach({name: run_dir / name for name in _RECORDS})


def _same_file(a: Path | None, b: Path | None) -> bool:
    """Both absent, or both present with the same bytes."""
    a_there, b_there = a is not None and a.is_file(), b is not None and b.is_file()
    if not (a_there and b_there):
        return a_there == b_there
    return filecmp.cmp(a, b, shallow=False)


def _partial(target: Path) -> Path:
    return target.with_name(f".{target.name}.unpack-partial")


def unpack(source: str | Path, out: str | Path, overwrite: bool = False,
           warn: Callable[[str], None] | None = None, keep_further: bool = False) -> dict[str, Any]:
    """Restore the run folders of archive ``source`` under ``out``; returns the archive's manifest.

    The archive is read through twice: first to check all of it (nothing written), then to write each file next
    to its place (``.<name>.unpack-partial``, hashed again while written), and only when all are written are
    they moved into place.

    Args:
        source: an archive written by :func:`pack`.
        out: the folder to restore into (the packed folder's place).
        overwrite: replace runs already there. A replaced run loses the progress records, results and checkpoints
            that the archive does not carry (they would contradict the restored state), unless it holds the
            archive's very state (the same ``progress.json``, ``history.csv`` and ``metrics.json``): then, e.g.,
            a finished run keeps its final weights.
        warn: called with one line per replaced run that had gone further than the archive's (finished, or more
            steps or epochs); default: printed on stderr. The run is replaced all the same, unless ``keep_further``.
        keep_further: with ``overwrite``, a run here that had gone further than the archive's is kept as it is
            (``warn`` names it) instead of replaced; the archive's other runs are restored. For a second slice on a
            machine that still holds the first slice's runs, while the archive carried is the older state.

    Raises:
        ArchiveError: unreadable archive, a manifest of the wrong shape or over :data:`MAX_TOTAL_BYTES`, an unsafe,
            unexpected or altered member, ``out`` or a place below it taken by something that is not a folder
            (or file), or (without ``overwrite``) a run file already under ``out``. Nothing is written in any of
            these cases.
    """
    source, out = Path(source), Path(out)
    if keep_further and not overwrite:
        raise ArchiveError("keeping the runs that had gone further applies with --overwrite (without it, nothing "
                           "already there is replaced)")
    if out.exists() and not out.is_dir():
        raise ArchiveError(f"{out}: exists and is not a folder; --out names the folder to restore into")
    manifest = _files(source)  # the whole archive checked before anything is written
    names = list(manifest["files"])
    targets = {name: _check_target(out, name) for name in names}
    runs = sorted({_split_name(name, source)[0] for name in names})
    carried = set(targets.values())
    left = {run: [f for f in _state_files(out / run) if f not in carried] for run in runs}
    existing = [t for t in targets.values() if t.exists()] + [f for files in left.values() for f in files]
    if existing and not overwrite:
        raise ArchiveError(f"{existing[0]} exists; unpack into an empty folder or pass --overwrite "
                           f"({len(existing)} file(s) would be replaced or removed)")
    _check_space(out, sum(record["bytes"] for record in manifest["files"].values()))
    with contextlib.ExitStack() as locks:
        for run in runs:
            _lock_run(out / run, locks)
        return _restore(source, out, manifest, targets, runs, left, carried, warn, keep_further)


def _lock_run(run_dir: Path, stack: contextlib.ExitStack) -> None:
    """Hold the write lock of ``run_dir`` (see ``rpm_lib.run_progress.RUN_LOCK``) until ``stack`` closes, where a
    run has trained there: a run still training would go on writing over the restored state (or the restored
    files over its epochs), and none may start while the files are replaced.

    Raises:
        ArchiveError: a training process holds it, or something other than a regular file sits at its path.
    """
    from rpm_lib.folder_lock import FolderBusyError, UnsafeLockFileError, exclusive_writer

    lock = run_dir / RUN_LOCK
    if not (lock.exists() or lock.is_symlink()):
        return  # no run has trained here since locks exist: none is training now
    try:
        stack.enter_context(exclusive_writer(lock, "rpm-train", folder=run_dir))
    except (FolderBusyError, UnsafeLockFileError) as error:
        raise ArchiveError(f"{error}; nothing unpacked") from None


def _restore(source: Path, out: Path, manifest: dict[str, Any], targets: dict[str, Path], runs: list[str],
             left: dict[str, list[Path]], carried: set[Path], warn: Callable[[str], None] | None,
             keep_further: bool = False) -> dict[str, Any]:
    """The writing half of :func:`unpack`, once everything is checked and the runs' locks are held."""
    written = _write_partials(source, out, targets)
    try:
        removed: list[Path] = []
        kept: set[str] = set()
        for run in runs:
            here = {name: out / run / name for name in _RECORDS}
            restored = {name: _partial(path) if path in carried else None for name, path in here.items()}
            if all(_same_file(here[name], restored[name]) for name in _RECORDS) and any(restored.values()):
                continue  # the archive's very state is here: what it does not carry belongs to that state
            reached, packed = _reach(here), _reach(restored)
            if reached.beyond(packed) and keep_further:
                (warn or _print_warning)(f"{out / run}: the run here had gone further ({reached}) than the "
                                         f"archive's ({packed}); kept (--keep-further)")
                kept.add(run)
                continue
            if reached.beyond(packed):
                (warn or _print_warning)(f"{out / run}: the run here had gone further ({reached}) than the "
                                         f"archive's ({packed}); replaced by the archive's (--overwrite)")
            removed += left[run]
        for path in removed:
            path.unlink()
        for name, target in targets.items():
            if _split_name(name, source)[0] in kept:
                _partial(target).unlink()
            else:
                _partial(target).replace(target)
        # folders made for a kept run's files (its checkpoints/<stage>/, say) are left empty: removed again
        kept_dirs = [(out / run).resolve() for run in kept]
        for path in sorted(written, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir() and any(path.resolve().is_relative_to(d) for d in kept_dirs) and not any(path.iterdir()):
                path.rmdir()
    except OSError as error:
        _discard(written)
        raise ArchiveError(f"{out}: cannot restore the runs ({error.filename}: {error.strerror or error})") from None
    return manifest


def _check_space(out: Path, needed: int) -> None:
    """Refuse to start writing ``needed`` bytes under ``out`` where the disk has less free (a full disk half-way
    would only be undone)."""
    place = out.absolute()
    while not place.exists():
        place = place.parent
    free = shutil.disk_usage(place).free
    if needed > free:
        raise ArchiveError(f"{out}: the archive's files need {needed / 1e9:.2f} GB, the disk has {free / 1e9:.2f} GB "
                           "free; nothing written")


def _print_warning(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def _write_partials(source: Path, out: Path, targets: dict[str, Path]) -> list[Path]:
    """Write every member of ``source`` next to its target (see :func:`_partial`); the partial files and folders
    created, deepest last. On an error those are removed again and ``ArchiveError`` raised."""
    created: list[Path] = []
    for folder in [out, *(t.parent for t in targets.values())]:
        for place in [*reversed(folder.parents), folder]:
            if not place.exists():
                created.append(place)
    created = list(dict.fromkeys(created))

    def sink(name: str) -> IO[bytes]:
        if name not in targets:
            raise ArchiveError(f"{source}: changed while it was unpacked; nothing written")
        return _partial(targets[name]).open("wb")

    try:
        for folder in created:
            folder.mkdir()
        _files(source, sink)
    except ArchiveError:
        _discard([*created, *(_partial(t) for t in targets.values())])
        raise  # the archive changed since it was checked
    except (_WriteFailed, OSError) as failure:
        _discard([*created, *(_partial(t) for t in targets.values())])
        error = failure.error if isinstance(failure, _WriteFailed) else failure
        raise ArchiveError(f"{out}: cannot write the runs ({error.filename}: {error.strerror or error})") from None
    return [*created, *(_partial(t) for t in targets.values())]


def _discard(paths: list[Path]) -> None:
    """Remove the partial files and (empty) folders of an unpack that did not complete."""
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def describe(runs: Iterable[PackedRun]) -> list[str]:
    """One line per packed run: folder, status, megabytes."""
    return [f"  {run.path:<60s} {run.status:<10s} {run.bytes / 1e6:7.2f} MB ({len(run.files)} files)" for run in runs]
