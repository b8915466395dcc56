"""A content fingerprint of a dataset folder: what a resumed run checks before it trains on "the same" data.

A time-boxed run may be resumed on another machine after its data were regenerated there (the generator is
deterministic). The fingerprint recorded when the run started must then equal the one of the regenerated
folder; otherwise the run would continue on other problems and its metrics would mean nothing.

It covers the bytes of every array file a reader uses (``.npy`` of a cache, ``.npz`` of a raw folder), each
named by its path relative to the folder. Records that describe how a folder was made (``manifest.json``,
``generator.json``, ``regime.json``, ``.xml``) are left out: they carry versions and plans that may differ
while the problems are identical. So is a cache's ``problem_hashes.npy`` (``rpm_lib.data.problem_hashes``): it
is derived from the problems, and caches made before it existed must keep their fingerprint. Files are hashed in 64 MiB pieces by a pool of threads (``hashlib`` releases
the GIL), so a 7 GB cache takes seconds; the value does not depend on the number of threads.
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rpm_lib.data.cache import is_cache
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import CACHE_ARRAY

#: Suffixes of the files a fingerprint covers.
DATA_SUFFIXES: tuple[str, ...] = (".npy", ".npz")
#: Array files that are records derived from the problems, not problems (see the module docstring).
DERIVED_RECORDS: frozenset[str] = frozenset({CACHE_ARRAY})
#: Bytes hashed per piece (one task of the thread pool).
PIECE = 64 * 1024 * 1024
#: Prefix of every fingerprint (the method; a later method gets another prefix instead of a silent mismatch).
METHOD = "sha256-pieces-v1"
#: Prefix of a problems fingerprint (:func:`problems_fingerprint`).
PROBLEMS_METHOD = "sha256-problems-v1"
#: A cache's pixel array, which a problems fingerprint leaves out.
PIXELS = "panels.npy"


def data_files(root: str | Path) -> list[Path]:
    """The array files of ``root`` (recursively), sorted by relative path; temporaries are skipped."""
    root = Path(root)
    if not root.is_dir():
        raise DataFormatError(f"{root}: not a dataset folder")
    files = [p for p in root.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file() and not p.is_symlink()
             and not p.name.startswith(".") and p.name not in DERIVED_RECORDS]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _hash_piece(path: Path, offset: int, length: int) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        handle.seek(offset)
        remaining = length
        while remaining > 0:
            block = handle.read(min(remaining, 8 * 1024 * 1024))
            if not block:
                raise DataFormatError(f"{path}: shorter than expected while fingerprinting (changed on disk?)")
            digest.update(block)
            remaining -= len(block)
    return digest.digest()


def _pieces_digest(root: Path, files: list[Path], workers: int | None) -> str:
    """SHA-256 over ``files`` (relative name, size, then the digests of their 64 MiB pieces, hashed in threads)."""
    pieces: list[tuple[Path, int, int]] = []
    sizes = []
    for path in files:
        size = path.stat().st_size
        sizes.append(size)
        pieces.extend((path, offset, min(PIECE, size - offset)) for offset in range(0, size, PIECE))
    workers = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda piece: _hash_piece(*piece), pieces))
    total = hashlib.sha256()
    index = 0
    for path, size in zip(files, sizes):
        count = len(range(0, size, PIECE))
        total.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
        for digest in digests[index:index + count]:
            total.update(digest)
        index += count
    return total.hexdigest()


def problems_fingerprint(root: str | Path, workers: int | None = None) -> str | None:
    """``"sha256-problems-v1:<hex>"`` over a cache's arrays but its pixels (``panels.npy``); None for a raw folder.

    Equal for two caches that hold the same problems (rules, answers, configurations, splits, row order) drawn by
    different OpenCV versions (:mod:`rpm_lib.data.opencv_version`), which :func:`data_fingerprint` tells apart.
    A raw folder keeps labels and pixels in one ``.npz`` per problem, so it has no such value.
    """
    root = Path(root)
    if not is_cache(root):
        return None
    files = [path for path in data_files(root) if path.name != PIXELS]
    if not files:
        return None
    return f"{PROBLEMS_METHOD}:{_pieces_digest(root, files, workers)}"


def data_fingerprint(root: str | Path, workers: int | None = None) -> str:
    """``"sha256-pieces-v1:<hex>"`` over the array files of ``root`` (see the module docstring).

    Args:
        root: a raw dataset folder or an ``rpm-data`` cache.
        workers: hashing threads (default: the CPU count, at most 16).

    Raises:
        DataFormatError: ``root`` is not a folder or holds no array file.
    """
    root = Path(root)
    files = data_files(root)
    if not files:
        raise DataFormatError(f"{root}: no .npy / .npz files to fingerprint")
    return f"{METHOD}:{_pieces_digest(root, files, workers)}"
