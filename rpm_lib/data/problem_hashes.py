"""Per-problem content hashes: which problems two data folders share, whatever their names or history.

A problem's hash is blake2b with a 16-byte digest over its panels exactly as the raw file stores them (uint8
(16, H, W), file answer order) and their shape, so it survives renaming, copying, regenerating the same problem
elsewhere and caching at any panel size. Training-vs-test overlap is the intersection of two sets of hashes;
it holds when a cache's raw folder is gone, renamed or replaced, because each folder keeps its own record:

* a raw folder written by ``rpm-generate``: ``problem_hashes.json`` (:data:`RAW_RECORD`), one entry per
  problem file, ``"<configuration>/RAVEN_<k>_<split>.npz": [hex digest, size in bytes, mtime in ns]``; the size
  and time say whether the file is still the one hashed (a replaced file is hashed again);
* a cache made by ``rpm-data prepare``: ``problem_hashes.npy``, uint8 (N, 16), one row per cache row (zeros
  for a skipped file), named in ``manifest.json`` field ``problem_hashes``.

Folders made before these records existed (and downloaded ones) are hashed when a check needs them, after a
one-line note on stderr; a cache of resized panels whose raw folder is gone cannot be hashed that way.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rpm_lib.data.errors import DataFormatError
from rpm_lib.json_files import write_object

#: The hash method (a record of another method is not compared, it is recomputed).
METHOD = "blake2b-16-panels-v1"
#: Digest length in bytes.
HASH_BYTES = 16
#: The record of a raw folder.
RAW_RECORD = "problem_hashes.json"
#: The row-aligned hashes of a cache.
CACHE_ARRAY = "problem_hashes.npy"


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
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataFormatError(f"{path}: unreadable problem-hash record ({error}); delete it and it is rebuilt") from None
    if not isinstance(data, dict) or data.get("method") != METHOD or not isinstance(data.get("problems"), dict):
        raise DataFormatError(f"{path}: not a {METHOD} problem-hash record (fields 'method', 'problems'); delete it "
                              "and it is rebuilt")
    found: dict[str, tuple[bytes, int, int]] = {}
    for name, entry in data["problems"].items():
        try:
            digest, size, mtime = entry
            value = bytes.fromhex(digest)
            if len(value) != HASH_BYTES or type(size) is not int or type(mtime) is not int:
                raise ValueError
        except (TypeError, ValueError):
            raise DataFormatError(f"{path}: entry {name!r} must be [hex digest of {HASH_BYTES} bytes, size, "
                                  f"mtime_ns], got {entry!r}; delete the file and it is rebuilt") from None
        found[name] = (value, size, mtime)
    return found


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


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
