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
* a finished run (``metrics.json``): ``metrics.json``, ``predictions*.npz`` and ``final_weights.pt`` (the weights
  its test scored, in bfloat16: ``rpm_lib.training.final_weights``); its full-precision final checkpoint only with
  ``keep_final_weights`` (resuming never needs it);
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

Unpacking is for files from elsewhere, so the whole archive is checked before anything is written
(``rpm_lib.runs.archive_manifest``): its ``rpm_state.json`` first (shape, a SHA-256 and size per file, at most
:data:`MAX_TOTAL_BYTES` in all, each run folder with its ``config.yaml``, names of at most
``MAX_NAME_CHARS`` characters), then every member, streamed (never held in memory): only regular files with the
names above, below a run folder, none below another member's path, each passed by tarfile's ``data`` extraction
filter for the folder unpacked into (no absolute paths, no ``..``, nothing reached through a link, no links, no
special files) and matching its SHA-256. Existing
run files are never replaced unless asked; with ``overwrite`` a run already there is replaced as a whole (its
progress records, results and checkpoints that the archive does not carry are removed, so none contradicts the
restored state), and a run that had gone further than the archive's is named in a warning; a run still training
there (its ``RUN_LOCK`` held) is refused. A symbolic link below the folder unpacked into (a run folder, a grid
folder, a checkpoints folder or a file) that a file would be written through or removed through is refused,
wherever it leads: nothing is written or removed outside that folder. Checkpoints are plain
tensors, read with ``torch.load(weights_only=True)`` when resumed, so an archive cannot run code.

This module is the archive's interface (``pack``, ``unpack``, ``read_manifest``, ...) and holds unpacking; packing
is ``rpm_lib.runs.archive_pack``, the format and its checked reading ``rpm_lib.runs.archive_manifest``.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import filecmp
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rpm_lib.json_files import printable, read_object_or_empty
from rpm_lib.run_folder import (CHECKPOINTS, CONFIG, FINISHED, HISTORY, METRICS, PROGRESS, RUN_LOCK, RUN_RECORD,
                                UNFINISHED)
from rpm_lib.runs.archive_manifest import (ALLOWED, CHECKPOINT_NAMES, FORMAT, MANIFEST, MAX_FILE_BYTES,
                                           MAX_TOTAL_BYTES, RESULT_FILES, RESULT_GLOB, RUN_FILES, VERSION,
                                           ArchiveError, WriteFailed, read_manifest, read_members, split_name)
from rpm_lib.runs.archive_pack import (COMPACT_STATE_KEYS, PackedRun, describe, find_runs, has_run_state, pack,
                                       run_status)
from rpm_lib.training.history import history_rows
from rpm_lib.training.setups import STAGES

__all__ = [
    "ArchiveError", "PackedRun", "pack", "unpack", "describe", "read_manifest", "find_runs", "has_run_state",
    "run_status", "run_reach", "MANIFEST", "FORMAT", "VERSION", "RUN_FILES", "RESULT_FILES", "RESULT_GLOB",
    "CHECKPOINT_NAMES", "COMPACT_STATE_KEYS", "MAX_FILE_BYTES", "MAX_TOTAL_BYTES",
]

#: Files of a run folder that describe the run rather than say how far it got: the only ones a run replaced by
#: ``unpack(overwrite=True)`` keeps when the archive does not carry them.
_DESCRIPTIONS: tuple[str, ...] = (CONFIG, RUN_RECORD)


def _state_files(run_dir: Path) -> list[Path]:
    """Files of ``run_dir`` that say how far its run got (progress, history, results, checkpoints): what a run
    restored over it must not keep, since they would contradict the restored state."""
    if not run_dir.is_dir():
        return []
    names = [n for n in (*RUN_FILES, *RESULT_FILES) if n not in _DESCRIPTIONS]
    names += sorted(p.name for p in run_dir.glob(RESULT_GLOB))
    names += [f"{CHECKPOINTS}/{stage}/{name}" for stage in STAGES for name in CHECKPOINT_NAMES]
    return [run_dir / name for name in names if ALLOWED.fullmatch(name) and (run_dir / name).is_file()]


def _refuse_links(out: Path, paths: Iterable[Path]) -> None:
    """Refuse ``paths`` (below ``out``) that are, or lie below, a symbolic link under ``out``.

    A run folder, a grid folder or a checkpoints folder linked to elsewhere would have the archive's files
    written there and a replaced run's files removed there; a file that is a link would be written through.
    ``out`` itself may be a link: it names the folder restored into.

    Raises:
        ArchiveError: naming the first link found; nothing has been written.
    """
    looked: set[Path] = set()
    for path in paths:
        place = out
        for part in path.relative_to(out).parts:
            place = place / part
            if place in looked:
                continue
            looked.add(place)
            if place.is_symlink():  # lstat: the link itself, wherever it leads
                raise ArchiveError(f"{place}: a symbolic link; unpack writes and removes nothing through a link "
                                   "below --out (replace the link by the folder or file itself); nothing unpacked")
            if not place.exists():
                break  # nothing below a place that is not there


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
_RECORDS: tuple[str, ...] = (PROGRESS, HISTORY, METRICS)


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
           warn: Callable[[str], None] | None = None, keep_further: bool = False,
           runs: Iterable[str] | None = None) -> dict[str, Any]:
    """Restore the run folders of archive ``source`` (or the ``runs`` among them) under ``out``; returns the
    archive's manifest.

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
        runs: restore only these run folders of the archive (paths as its manifest lists them), e.g. the runs of
            an older archive that no newer one of a single run replaces; the whole archive is checked all the same.

    Raises:
        ArchiveError: unreadable archive, a manifest of the wrong shape or over :data:`MAX_TOTAL_BYTES`, an unsafe,
            unexpected or altered member, ``out`` or a place below it taken by something that is not a folder
            (or file), a symbolic link below ``out`` that a file would be written or removed through (or a file
            that is one), one of ``runs`` that the archive does not hold, or (without ``overwrite``) a run file
            already under ``out``. Nothing is written in any of these cases.
    """
    source, out = Path(source), Path(out)
    if keep_further and not overwrite:
        raise ArchiveError("keeping the runs that had gone further applies with --overwrite (without it, nothing "
                           "already there is replaced)")
    if out.exists() and not out.is_dir():
        raise ArchiveError(f"{out}: exists and is not a folder; --out names the folder to restore into")
    listed = read_manifest(source)  # its names are checked here; every member is checked against it below
    names = list(listed["files"])
    if runs is not None:
        chosen = _chosen_runs(listed, runs, source)
        names = [name for name in names if split_name(name, source)[0] in chosen]
    folders = sorted({split_name(name, source)[0] for name in names})
    places = [out.joinpath(*PurePosixPath(name).parts) for name in names]
    carried = set(places)
    left = {run: [f for f in _state_files(out / run) if f not in carried] for run in folders}
    # before the members' check, which would blame the archive for a link that leads out of ``out``
    _refuse_links(out, [*places, *map(_partial, places), *(f for files in left.values() for f in files)])
    manifest = read_members(source, out, max_total_bytes=MAX_TOTAL_BYTES)  # all checked before anything is written
    targets = {name: _check_target(out, name) for name in names}
    skipped = set(manifest["files"]) - set(names)
    existing = [t for t in targets.values() if t.exists()] + [f for files in left.values() for f in files]
    if existing and not overwrite:
        raise ArchiveError(f"{existing[0]} exists; unpack into an empty folder or pass --overwrite "
                           f"({len(existing)} file(s) would be replaced or removed)")
    _check_space(out, sum(manifest["files"][name]["bytes"] for name in names))
    with contextlib.ExitStack() as locks:
        for run in folders:
            _lock_run(out / run, locks)
        return _restore(source, out, manifest, targets, folders, left, carried, warn, keep_further, skipped)


def _chosen_runs(manifest: dict[str, Any], runs: Iterable[str], source: Path) -> set[str]:
    """The run folders ``runs`` (normalised), each one that the archive's ``manifest`` lists.

    Raises:
        ArchiveError: one the archive does not hold, named with the runs it does.
    """
    held = {record["path"] for record in manifest["runs"]}
    chosen = {PurePosixPath(name).as_posix() for name in runs}
    unknown = sorted(chosen - held)
    if unknown:
        raise ArchiveError(f"{source}: holds no run {unknown[0]!r} (its runs: {', '.join(sorted(held))}); nothing "
                           "unpacked")
    return chosen


def _lock_run(run_dir: Path, stack: contextlib.ExitStack) -> None:
    """Hold the write lock of ``run_dir`` (see ``rpm_lib.run_folder.RUN_LOCK``) until ``stack`` closes, where a
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
             keep_further: bool = False, skipped: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """The writing half of :func:`unpack`, once everything is checked and the runs' locks are held (``skipped``:
    the members of runs not chosen, read through and discarded)."""
    written = _write_partials(source, out, targets, skipped)
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
                (warn or _print_warning)(f"{printable(str(out / run), 500)}: the run here had gone further "
                                         f"({reached}) than the archive's ({packed}); kept (--keep-further)")
                kept.add(run)
                continue
            if reached.beyond(packed):
                (warn or _print_warning)(f"{printable(str(out / run), 500)}: the run here had gone further "
                                         f"({reached}) than the archive's ({packed}); replaced by the archive's "
                                         "(--overwrite)")
            removed += left[run]
        for path in removed:
            path.unlink()
        for name, target in targets.items():
            if split_name(name, source)[0] in kept:
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


def _write_partials(source: Path, out: Path, targets: dict[str, Path],
                    skipped: set[str] | frozenset[str] = frozenset()) -> list[Path]:
    """Write every member of ``source`` next to its target (see :func:`_partial`), discarding the ``skipped``
    ones; the partial files and folders created, deepest last. On an error those are removed again and
    ``ArchiveError`` raised."""
    created: list[Path] = []
    for folder in [out, *(t.parent for t in targets.values())]:
        for place in [*reversed(folder.parents), folder]:
            if not place.exists():
                created.append(place)
    created = list(dict.fromkeys(created))

    def sink(name: str) -> IO[bytes]:
        if name in skipped:
            return open(os.devnull, "wb")  # read through for its SHA-256 check, written nowhere
        if name not in targets:
            raise ArchiveError(f"{source}: changed while it was unpacked; nothing written")
        # O_NOFOLLOW: a link put at the partial file's name since the check is not written through
        descriptor = os.open(_partial(targets[name]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        return os.fdopen(descriptor, "wb")

    try:
        for folder in created:
            folder.mkdir()
        read_members(source, out, sink, max_total_bytes=MAX_TOTAL_BYTES)
    except ArchiveError:
        _discard([*created, *(_partial(t) for t in targets.values())])
        raise  # the archive changed since it was checked
    except (WriteFailed, OSError) as failure:
        _discard([*created, *(_partial(t) for t in targets.values())])
        error = failure.error if isinstance(failure, WriteFailed) else failure
        raise ArchiveError(f"{out}: cannot write the runs ({error.filename}: {error.strerror or error})") from None
    return [*created, *(_partial(t) for t in targets.values())]


def _discard(paths: list[Path]) -> None:
    """Remove the partial files and (empty) folders of an unpack that did not complete."""
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


