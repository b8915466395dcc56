"""Per-problem content hashes: which problems two data folders share, whatever their names, history or records.

A problem's hash is blake2b with a 16-byte digest over its panels exactly as the raw file stores them (uint8
(16, H, W), file answer order) and their shape, so it survives renaming, copying, regenerating the same problem
elsewhere and caching at any panel size. Each folder keeps a record of its problems' hashes:

* a raw folder written by ``rpm-generate``: ``problem_hashes.json`` (:data:`RAW_RECORD`), one entry per
  problem file, ``"<configuration>/RAVEN_<k>_<split>.npz": [hex digest, size in bytes, mtime in ns]``; the size
  and time say whether the file is still the one hashed (a replaced file is hashed again);
* a cache made by ``rpm-data prepare``: ``problem_hashes.npy``, uint8 (N, 16), one row per cache row (zeros
  for a skipped file), named in ``manifest.json`` field ``problem_hashes``.

Folders made before these records existed (and downloaded ones) are hashed when a check needs them, after a
one-line note on stderr; a cache of resized panels whose raw folder is gone cannot be hashed that way.

These records come from shared folders: copied with a folder into another, edited, or kept beside a file replaced
with its size and time forged, they may say anything. The training-vs-test overlap check therefore compares what
the folders hold (:class:`ProblemPanels`, :func:`shared_by_content`): the original panels where both folders
have them, else the resized panels of a cache against the other folder's panels resized the same way; records
only say, in a note, where they disagree with the panels.
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rpm_lib.data.errors import DataFormatError
from rpm_lib.json_files import read_object, shown_value, write_object

#: The hash method (a record of another method is not compared, it is recomputed).
METHOD = "blake2b-16-panels-v1"
#: Digest length in bytes.
HASH_BYTES = 16
#: The record of a raw folder.
RAW_RECORD = "problem_hashes.json"
#: The row-aligned hashes of a cache.
CACHE_ARRAY = "problem_hashes.npy"
#: Largest ``problem_hashes.json`` read: an entry is about 100 bytes, so this leaves room for some 5 million
#: problems (full I-RAVEN, 70,000 problems, records 7 MB).
RAW_RECORD_MAX_BYTES = 512 << 20


def panels_hash(panels: np.ndarray) -> bytes:
    """The 16-byte hash of one problem's panels: uint8 (16, H, W) in file answer order, as its raw file stores
    them."""
    panels = np.ascontiguousarray(panels, dtype=np.uint8)
    digest = hashlib.blake2b(digest_size=HASH_BYTES)
    digest.update(repr(tuple(panels.shape)).encode())
    digest.update(memoryview(panels).cast("B"))
    return digest.digest()


def note(message: str) -> None:
    """One line on stderr: something is done that the user should know about, but nothing is wrong."""
    print(f"rpm_lib: note: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# raw folders
# ----------------------------------------------------------------------------------------------
def read_raw_record(root: str | Path) -> dict[str, tuple[bytes, int, int]]:
    """``{relative .npz path: (hash, size, mtime_ns)}`` from ``root``'s record; empty when there is none.

    Raises:
        DataFormatError: the record exists but is not one (one line naming it).
    """
    path = Path(root) / RAW_RECORD
    if not path.is_file():
        return {}
    rebuilt = "delete it and it is rebuilt"
    data = read_object(path, DataFormatError, rebuilt, max_bytes=RAW_RECORD_MAX_BYTES,
                       fields={"method": str, "problems": dict})
    if data.get("method") != METHOD or not isinstance(data.get("problems"), dict):
        raise DataFormatError(f"{path}: not a {METHOD} problem-hash record (fields 'method', 'problems'); {rebuilt}")
    found: dict[str, tuple[bytes, int, int]] = {}
    for name, entry in data["problems"].items():
        try:
            digest, size, mtime = entry
            value = bytes.fromhex(digest)
            if len(value) != HASH_BYTES or type(size) is not int or type(mtime) is not int:
                raise ValueError
        except (TypeError, ValueError):
            raise DataFormatError(f"{path}: entry {shown_value(name)} must be [hex digest of {HASH_BYTES} bytes, "
                                  f"size, mtime_ns], got {shown_value(entry)}; delete the file and it is "
                                  "rebuilt") from None
        found[name] = (value, size, mtime)
    return found


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def recorded_entry(record: dict[str, tuple[bytes, int, int]], root: str | Path, path: str | Path) -> bytes | None:
    """The hash ``record`` (:func:`read_raw_record` of ``root``) gives problem file ``path``, or None when it has
    none or the file's size or time differ from the recorded ones (replaced since)."""
    entry = record.get(Path(path).relative_to(root).as_posix())
    return entry[0] if entry is not None and _stat_key(Path(path)) == entry[1:] else None


def write_raw_record(root: str | Path, hashes: dict[str, bytes]) -> None:
    """Add ``{relative .npz path: hash}`` of files just written in ``root`` to its record (atomically); entries
    of files that no longer exist are dropped."""
    root = Path(root)
    try:
        entries = {name: value for name, value in read_raw_record(root).items() if (root / name).is_file()}
    except DataFormatError:
        entries = {}  # a damaged record is rebuilt from what is known now
    for name, digest in hashes.items():
        entries[name] = (digest, *_stat_key(root / name))
    record = {"method": METHOD, "problems": {name: [value.hex(), size, mtime]
                                             for name, (value, size, mtime) in sorted(entries.items())}}
    # No flush to disk: a lost or damaged record is rebuilt from the problem files.
    write_object(root / RAW_RECORD, record, indent=None, separators=(",", ":"), fsync=False)


def raw_hashes(root: str | Path, paths: Iterable[Path], load) -> tuple[list[bytes], int]:
    """The hashes of the problem files ``paths`` of raw folder ``root``, in order, and how many of them had to
    be computed now (not in the record, or the file changed since it was recorded).

    ``load(path)`` returns the problem's validated record (``load_raven_npz`` / ``load_pgm_npz``).
    """
    root = Path(root)
    recorded = read_raw_record(root)
    out: list[bytes] = []
    computed = 0
    for path in paths:
        name = Path(path).relative_to(root).as_posix()
        entry = recorded.get(name)
        if entry is not None and _stat_key(Path(path)) == entry[1:]:
            out.append(entry[0])
            continue
        out.append(panels_hash(load(path).panels))
        computed += 1
    return out, computed


def shared_problems(first: list[bytes] | np.ndarray, second: list[bytes] | np.ndarray) -> list[tuple[int, int]]:
    """``(i, j)`` pairs where problem ``i`` of ``first`` has the panels of problem ``j`` of ``second`` (one pair
    per problem of ``second``, ordered by ``j``)."""
    index = {bytes(value): i for i, value in enumerate(first)}
    return [(index[bytes(value)], j) for j, value in enumerate(second) if bytes(value) in index]


# ----------------------------------------------------------------------------------------------
# comparing two folders' problems by what they hold
# ----------------------------------------------------------------------------------------------
#: Panel side of the problem files (I-RAVEN, RAVEN and PGM store 160 px panels): a cache of this size holds the
#: original panels, a smaller one only resized copies of them.
ORIGINAL_SIZE = 160
#: Threads that read and hash problems (file reads, zip CRCs, copies and blake2b release the GIL).
THREADS = max(1, min(8, os.cpu_count() or 1))
#: A sample key covers about this many pixel rows and columns of every panel (its stride: side // this).
_SAMPLED_LINES = 20

#: The panels two folders are compared at: ``None`` for the original panels, ``(size px, resize method)`` for
#: panels resized so (``rpm_lib.data.resize.resize_panels``).
Level = tuple[int, str] | None


class ProblemPanels:
    """The panels of one dataset's problems, read from its folder -- its problem files or its cache rows, never
    its records -- so that two folders are compared by what they hold: a copied, edited or forged record cannot
    hide a shared problem.

    Of a raw file only the ``image`` member is read where it is plain uint8 (16, H, H): the panels the dataset's
    loader returns for it (any other image goes through the loader, which checks it).

    Args:
        dataset: an ``RpmDataset`` (``RavenDataset`` / ``PgmDataset``) of one split.

    Attributes:
        root, split: the dataset's folder and split.
        source_ids: the problems' names, in sample order.
        stored: ``(size px, resize method)`` of a cache of resized panels; ``None`` when the folder holds the
            original panels (a raw folder, or a cache at :data:`ORIGINAL_SIZE`).
        resized_by: the OpenCV version that resized a cache's panels, when its manifest records it.
    """

    def __init__(self, dataset: Any) -> None:
        self.root = Path(dataset.root)
        self.split = dataset.split
        self.source_ids = list(dataset.source_ids)
        self._dataset = dataset
        self.stored: Level = None
        self.resized_by: str | None = None
        manifest = dataset.cache_manifest
        if manifest is not None:
            size = int(manifest["image_size"])
            if size != ORIGINAL_SIZE:
                from rpm_lib.data.opencv_version import recorded

                self.stored = (size, str(manifest["resize"]))
                self.resized_by = recorded(self.root)["resized"]
        self._digests: dict[Level, list[tuple[bytes, bytes]]] = {}

    def __len__(self) -> int:
        return len(self.source_ids)

    def panels(self, index: int) -> np.ndarray:
        """uint8 (16, S, S) panels of problem ``index`` as the folder holds them (file answer order)."""
        return self._dataset.stored_panels(index)

    def digests(self, level: Level) -> list[tuple[bytes, bytes]]:
        """``(sample key, hash)`` of every problem's panels at ``level`` (:func:`sample_key`, :func:`panels_hash`);
        a problem whose panels cannot be brought to ``level`` (smaller than it) gets ``(b"", b"")``, which
        matches nothing."""
        self.compute([level])
        return self._digests[level]

    def compute(self, levels: Iterable[Level]) -> None:
        """Hash every problem at each of ``levels`` not hashed yet, reading each problem once."""
        levels = [level for level in dict.fromkeys(levels) if level not in self._digests]
        if not levels:
            return

        def digest(index: int) -> list[tuple[bytes, bytes]]:
            panels = self.panels(index)
            out = []
            for level in levels:
                resized = at_level(panels, level)
                out.append((b"", b"") if resized is None else (sample_key(resized), panels_hash(resized)))
            return out

        found = _each_problem(self, digest)
        for number, level in enumerate(levels):
            self._digests[level] = [problem[number] for problem in found]

    def recorded(self) -> list[bytes | None]:
        """The hash the folder's record gives for each problem (``problem_hashes.json`` of a raw folder,
        ``problem_hashes.npy`` of a cache); ``None`` where there is none, or where the file changed (size or
        time) since it was recorded.

        Raises:
            DataFormatError: a damaged record (one line naming it).
        """
        return self._dataset.recorded_hashes()

    def check_records(self, against_panels: bool) -> None:
        """Say in a note on stderr how many problems the folder's record does not record (raw folders) and, with
        ``against_panels`` (for a folder of original panels), how many it records with another hash than their
        panels have (copied from another folder, edited, or a file replaced keeping its size and time). The record
        is never used in the panels' place.

        Raises:
            DataFormatError: a damaged record (one line naming it).
        """
        recorded = self.recorded()
        if not self._dataset.from_cache:
            missing = sum(value is None for value in recorded)
            if missing:
                note(f"{self.root}: hashed {missing} {self.split} problem(s) that its {RAW_RECORD} does not record "
                     "(made before it existed, downloaded, or changed since)")
        if not against_panels or self.stored is not None:
            return
        wrong = sum(value is not None and value != digest for value, (_, digest) in zip(recorded, self.digests(None)))
        if wrong:
            what = f"{CACHE_ARRAY} row" if self._dataset.from_cache else f"{RAW_RECORD} entry"
            note(f"{self.root}: the {what} of {wrong} {self.split} problem(s) does not match its panels (copied "
                 "from another folder, edited, or a file replaced keeping its size and time); compared by the "
                 "panels instead")


def at_level(panels: np.ndarray, level: Level) -> np.ndarray | None:
    """``panels`` uint8 (16, H, H) at ``level`` (unchanged for ``None`` or an ``H`` equal to the level's size);
    ``None`` when they cannot be resized to it (smaller, or no integer factor for ``stride``)."""
    if level is None:
        return panels
    from rpm_lib.data.resize import resize_panels

    try:
        return resize_panels(panels, *level)
    except ValueError:
        return None


def sample_key(panels: np.ndarray) -> bytes:
    """An 8-byte key of every ``side // 20``-th pixel row and column of every panel, and the panels' shape:
    problems with equal panels have equal keys, so only the problems whose key another folder has need the
    full hash (which reads every pixel)."""
    step = max(1, panels.shape[-1] // _SAMPLED_LINES)
    digest = hashlib.blake2b(repr(tuple(panels.shape)).encode(), digest_size=8)
    digest.update(np.ascontiguousarray(panels[:, ::step, ::step]).tobytes())
    return digest.digest()


def comparison_level(first: ProblemPanels, second: ProblemPanels) -> tuple[bool, Level, bool]:
    """How two folders' problems can be compared by content: ``(comparable, level, exact)``.

    The original panels where both folders hold them; else the resized panels a cache holds, the other folder's
    originals resized the same way (or another cache's panels of that size and method). Not comparable: two
    caches resized differently. ``exact``: equal problems are sure to give equal panels at ``level`` (no
    resizing, an integer factor, or OpenCV's area resize by one recorded version); else a problem both hold may
    have been resized differently by two OpenCV versions (some pixels by a few grey levels).
    """
    stored = {panels.stored for panels in (first, second)} - {None}
    if len(stored) > 1:
        return False, None, False
    if not stored:
        return True, None, True
    level = stored.pop()
    size, method = level
    if method == "stride" or ORIGINAL_SIZE % size == 0:
        return True, level, True
    import cv2

    # Panels resized by OpenCV: by the version each cache records, or by this one for a folder of originals.
    versions = {panels.resized_by if panels.stored is not None else str(cv2.__version__) for panels in (first, second)}
    return True, level, None not in versions and len(versions) == 1


def shared_by_content(own: ProblemPanels, tested: ProblemPanels, level: Level) -> list[tuple[int, int]]:
    """``(i, j)`` pairs where problem ``j`` of ``tested`` has the panels (at ``level``) of problem ``i`` of ``own``,
    one per problem of ``tested``, ordered by ``j``; both read from their folders.

    Every problem of ``tested`` is hashed whole; of ``own`` (typically the larger training split) only a sample of
    each problem's pixels is hashed (:func:`sample_key`), and whole only where the key is one of ``tested``'s.
    """
    wanted = tested.digests(level)
    keys = {key for key, _ in wanted if key}

    def candidate(i: int) -> bytes | None:
        panels = at_level(own.panels(i), level)
        if panels is None or sample_key(panels) not in keys:
            return None
        return panels_hash(panels)

    own_index: dict[bytes, int] = {}
    for i, digest in enumerate(_each_problem(own, candidate)):
        if digest is not None:
            own_index[digest] = i  # the last of equal problems, as shared_problems gives
    return [(own_index[digest], j) for j, (_, digest) in enumerate(wanted) if digest and digest in own_index]


def _each_problem(panels: ProblemPanels, function: Callable[[int], Any]) -> list[Any]:
    """``[function(0), ..., function(len(panels) - 1)]``, on :data:`THREADS` threads (the first alone: it maps a
    cache's panels once); a failure stops what has not started and is raised."""
    count = len(panels)
    if count == 0:
        return []
    out = [function(0)]
    if count == 1 or THREADS == 1:
        return out + [function(index) for index in range(1, count)]
    executor = ThreadPoolExecutor(THREADS)
    try:
        return out + list(executor.map(function, range(1, count)))
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
