"""The memory-mapped cache of resized problems (``rpm-data prepare``).

Layout of a finished cache folder (N rows, S px)::

    manifest.json     written last: its presence marks the cache complete (kind, size, resize, counts, plan)
    panels.npy        uint8 (N, 16, S, S), file answer order, memory-mapped on read
    targets.npy       int64 (N,)          correct choice in file order
    meta.npy          uint8 (N, 8, 9) RAVEN meta_matrix, (N, 12, 9) when a problem has an I-RAVEN-Mesh Mesh
                      (manifest "meta_rows") | (N, 4, 12) PGM relation_structure_encoded
    meta_target.npy   uint8 (N, 9) | (N, 12)
    groups.npy        int16 (N,)  index into rules.CONFIGURATIONS (RAVEN) / rules.PGM_REGIMES (PGM)
    splits.npy        int8 (N,)   index into raw_files.SPLITS
    file_ids.npy      int64 (N,)  k of RAVEN_<k>_<split> / id of PGM_<regime>_<split>_<id>
    valid.npy         bool (N,)   False for rows of files skipped with on_error="skip" (zero pixels)
    skipped.txt       one "<file>\\t<reason>" line per skipped file (on_error="skip" only)
    problem_hashes.npy uint8 (N, 16) content hash of each row's original panels (problem_hashes.py; zeros for
                      a skipped file), named by manifest "problem_hashes"

The manifest also records ``regime``: the raw folder's checked ``regime.json`` content at build time (``null``
when it has none), so a cache keeps saying what its problems are after its raw folder is gone or replaced.
Its ``plan`` says what the cache was built from: a raw folder's path and its files' names, sizes and times, or,
for a cache that ``rpm-generate --cache-size`` filled without files (``rpm_lib.generator.cache_writer``), the
generator settings (``plan["generator"]``); the arrays are the same either way.

Only the keys ``load_raven_npz`` / ``load_pgm_npz`` return are stored; raven-datasets' ``meta_answer_mods``
(which gives the answer away) is never read, so nothing in a cache derives from it.

Rows are ordered by group (``rules`` order), then file id. The build writes into ``<out>.partial/``
with a journal of finished chunks (``journal.jsonl``) and resumes from it; only a complete build gets a
manifest and is renamed to ``<out>``, so an interrupted run never leaves something that looks complete.
Workers (processes) write disjoint row ranges of the same memory-mapped ``panels.npy``; nothing holds
the whole dataset in RAM.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from rpm_lib import rules
import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import CACHE_ARRAY, HASH_BYTES, METHOD as HASH_METHOD, panels_hash
from rpm_lib.data.raw_files import SPLITS, RawFile, find_pgm_files, find_raven_files, pgm_source_id, raven_source_id
from rpm_lib.data.resize import check_resize, resize_panels
from rpm_lib.data.validation import NUM_PANELS, PGM_MAX_TRIPLES, RpmRecord, load_pgm_npz, load_raven_npz
from rpm_lib.folder_lock import check_free_space, exclusive_writer

CACHE_FORMAT = "rpm_lib-cache"
CACHE_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "journal.jsonl"
PLAN = "plan.json"
SKIPPED = "skipped.txt"
ON_ERROR = ("stop", "skip")


@dataclass(frozen=True)
class _Kind:
    """One dataset kind. ``meta_shape`` is its plain label shape; ``build_meta_shape`` the one a build stores
    first (RAVEN: room for a Mesh, trimmed back to ``meta_shape`` at the end when no problem has one)."""

    name: str
    groups: tuple[str, ...]
    meta_shape: tuple[int, ...]
    meta_target_dim: int
    load: Callable[..., RpmRecord]
    source_id: Callable[[str, int, str], str]
    build_meta_shape: tuple[int, ...]

    @property
    def meta_rows(self) -> tuple[int, ...]:
        """The row counts a finished cache's ``meta.npy`` may have (manifest field ``meta_rows``)."""
        return tuple(dict.fromkeys((self.meta_shape[0], self.build_meta_shape[0])))


_RAVEN_WIDTH = len(rules.META_TARGET_FORMAT)
_PGM_META = (PGM_MAX_TRIPLES, len(rules.PGM_META_TARGET_FORMAT))
KINDS: dict[str, _Kind] = {
    "raven": _Kind("raven", rules.CONFIGURATIONS, (rules.META_ROWS, _RAVEN_WIDTH), _RAVEN_WIDTH, load_raven_npz,
                   raven_source_id, (rules.MESH_META_ROWS, _RAVEN_WIDTH)),
    "pgm": _Kind("pgm", rules.PGM_REGIMES, _PGM_META, len(rules.PGM_META_TARGET_FORMAT), load_pgm_npz, pgm_source_id,
                 _PGM_META),
}


def kind_spec(kind: str) -> _Kind:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; expected one of {list(KINDS)}") from None


def is_cache(path: str | Path) -> bool:
    """True when ``path`` is a complete cache (has a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise DataFormatError(f"{path}: not a complete rpm_lib cache (no {MANIFEST})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataFormatError(f"{path / MANIFEST}: unreadable manifest ({error})") from None
    if not isinstance(manifest, dict):
        raise DataFormatError(f"{path / MANIFEST}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != CACHE_FORMAT or manifest.get("version") != CACHE_VERSION:
        raise DataFormatError(
            f"{path / MANIFEST}: not an rpm_lib cache of version {CACHE_VERSION} "
            f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})"
        )
    return manifest


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRecords:
    """A build's rows read from their files: called with a row's ``file``, it loads and validates ``file.path``
    (``rpm-data prepare``).

    Another source (``rpm_lib.generator.cache_writer.GeneratedRecords``) makes the same records without files;
    a source is called in worker processes, so it must pickle.
    """

    kind: str

    def __call__(self, file: RawFile) -> RpmRecord:
        return KINDS[self.kind].load(file.path)


@dataclass
class _Chunk:
    """A contiguous range of rows converted by one worker call."""

    chunk_id: int
    start: int
    files: list[RawFile]
    kind: str
    size: int
    resize: str
    panels_path: str
    on_error: str
    source: Callable[[RawFile], RpmRecord]


@dataclass
class _ChunkResult:
    chunk_id: int
    start: int
    ok: np.ndarray  # bool (n,)
    targets: np.ndarray  # int64 (n,)
    meta: np.ndarray  # uint8 (n, ...)
    meta_target: np.ndarray  # uint8 (n, d)
    skipped: list[tuple[str, str]]
    hashes: np.ndarray  # uint8 (n, HASH_BYTES), zeros for a skipped file


def _init_worker() -> None:
    import cv2

    cv2.setNumThreads(1)  # one process per core already; avoid oversubscription


def _convert_chunk(chunk: _Chunk) -> _ChunkResult:
    """Get the chunk's validated problems from its source, resize them into its rows of ``panels.npy``; return
    its labels."""
    spec = KINDS[chunk.kind]
    n = len(chunk.files)
    result = _ChunkResult(
        chunk.chunk_id,
        chunk.start,
        np.zeros(n, dtype=bool),
        np.zeros(n, dtype=np.int64),
        np.zeros((n, *spec.build_meta_shape), dtype=np.uint8),
        np.zeros((n, spec.meta_target_dim), dtype=np.uint8),
        [],
        np.zeros((n, HASH_BYTES), dtype=np.uint8),
    )
    panels = np.load(chunk.panels_path, mmap_mode="r+")
    try:
        for j, file in enumerate(chunk.files):
            path = str(file.path)
            try:
                record = chunk.source(file)
                resized = resize_panels(record.panels, chunk.size, chunk.resize)
            except (DataFormatError, ValueError) as error:
                message = str(error) if isinstance(error, DataFormatError) else f"{path}: {error}"
                if chunk.on_error == "stop":
                    raise DataFormatError(message) from None
                result.skipped.append((path, message))
                continue
            panels[chunk.start + j] = resized
            result.ok[j] = True
            result.targets[j] = record.target
            result.meta[j, : record.meta.shape[0]] = record.meta  # a plain RAVEN problem: zero Mesh rows
            result.meta_target[j] = record.meta_target
            result.hashes[j] = np.frombuffer(panels_hash(record.panels), dtype=np.uint8)
        panels.flush()
    finally:
        del panels
    return result


def names_sha256(names: Sequence[str]) -> str:
    """The plan's ``files_sha256``: which problems, by their names relative to the source folder, in row order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}\n".encode())
    return digest.hexdigest()


def _plan(kind: str, root: Path, files: list[RawFile], size: int, resize: str, chunk_size: int) -> dict:
    # Names say which files; size and modification time (ns) say which contents, without reading them: a file
    # regenerated or replaced under the same name changes its time, so the cache is rebuilt, not trusted.
    content = hashlib.sha256()
    names = []
    for f in files:
        name = f.path.relative_to(root)
        stat = f.path.stat()
        names.append(str(name))
        content.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return {
        "kind": kind,
        "image_size": size,
        "resize": resize,
        "source_root": str(root),
        "num_rows": len(files),
        "files_sha256": names_sha256(names),
        "content_sha256": content.hexdigest(),
        "chunk_size": chunk_size,
        opencv_version.KEY: {"rendered": opencv_version.rendered_by(root) if kind == "raven" else None,
                             "resized": opencv_version.current()},
    }


#: The plan fields that say which inputs and settings a cache was built from.
_INPUT_KEYS = ("kind", "image_size", "resize", "source_root", "num_rows", "files_sha256", "content_sha256")


def _same_inputs(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in _INPUT_KEYS)


def _same_opencv(previous: dict, plan: dict) -> bool:
    """Whether a build may go on where ``previous`` stopped: another OpenCV would draw or resize some pixels
    differently (``rpm_lib.data.opencv_version``), and one cache must not mix the two. A plan from before the
    record says nothing either way."""
    return opencv_version.KEY not in previous or previous[opencv_version.KEY] == plan.get(opencv_version.KEY)


def _differences(previous: dict, plan: dict) -> str:
    """What differs between two plans, for a message: for two generated caches the generator settings, size and
    row count by name and value; otherwise the names of the differing input keys."""
    old, new = previous.get("generator"), plan.get("generator")
    if isinstance(old, dict) and isinstance(new, dict):
        said = [f"{k} {old.get(k)!r} there, {new.get(k)!r} asked" for k in sorted({*old, *new})
                if old.get(k) != new.get(k)]
        said += [f"{k} {previous.get(k)!r} there, {plan.get(k)!r} asked" for k in ("image_size", "resize", "num_rows")
                 if previous.get(k) != plan.get(k)]
        if previous.get("files_sha256") != plan.get("files_sha256") and previous.get("num_rows") == plan.get("num_rows"):
            said.append("the problem indices or configurations")
        if said:
            return ", ".join(said)
    return ", ".join(k for k in _INPUT_KEYS if previous.get(k) != plan.get(k))


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


#: The arrays of a build that ``_allocate`` writes whole from the file list (the rest are filled chunk by chunk).
_INDEX_ARRAYS = ("groups.npy", "splits.npy", "file_ids.npy")


def _build_layout(n: int, size: int, spec: _Kind) -> dict[str, tuple[type, tuple[int, ...]]]:
    """Every array of a build of ``n`` rows at ``size`` px, as file name -> (dtype, shape): what ``_allocate``
    makes and what an interrupted build must still hold to be continued (``_partial_damage``)."""
    return {
        "groups.npy": (np.int16, (n,)),
        "splits.npy": (np.int8, (n,)),
        "file_ids.npy": (np.int64, (n,)),
        "panels.npy": (np.uint8, (n, NUM_PANELS, size, size)),
        "targets.npy": (np.int64, (n,)),
        "meta.npy": (np.uint8, (n, *spec.build_meta_shape)),
        "meta_target.npy": (np.uint8, (n, spec.meta_target_dim)),
        "valid.npy": (np.bool_, (n,)),
        CACHE_ARRAY: (np.uint8, (n, HASH_BYTES)),
    }


def _allocate(partial: Path, spec: _Kind, files: list[RawFile], size: int, plan: dict) -> None:
    """Create the partial folder: row index arrays, empty memory-mapped outputs, then the plan."""
    partial.mkdir(parents=True)
    layout = _build_layout(len(files), size, spec)
    index_values = {"groups.npy": [spec.groups.index(f.group) for f in files],
                    "splits.npy": [SPLITS.index(f.split) for f in files],
                    "file_ids.npy": [f.file_id for f in files]}
    for name in _INDEX_ARRAYS:
        np.save(partial / name, np.array(index_values[name], dtype=layout[name][0]))
    outputs = {name: layout[name] for name in layout if name not in _INDEX_ARRAYS}
    for name, (dtype, shape) in outputs.items():
        array = np.lib.format.open_memmap(partial / name, mode="w+", dtype=dtype, shape=shape)
        array.flush()
        del array
    (partial / JOURNAL).touch()
    _write_json_atomic(partial / PLAN, plan)  # last: its presence means the folder is fully allocated


def _read_journal(partial: Path) -> tuple[set[int], list[tuple[str, str]]]:
    """Finished chunk ids and the files they skipped. A torn last line (killed mid-write) is ignored."""
    done: set[int] = set()
    skipped: list[tuple[str, str]] = []
    journal = partial / JOURNAL
    if not journal.exists():
        return done, skipped
    for line in journal.read_text(errors="replace").splitlines():
        # Any line that is not a whole entry (torn by a kill, or garbled) only means its chunk is made again.
        try:
            entry = json.loads(line)
            chunk = entry["chunk"]
            reasons = [(str(path), str(reason)) for path, reason in entry["skipped"]]
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            continue
        if isinstance(chunk, int) and not isinstance(chunk, bool):
            done.add(chunk)
            skipped.extend(reasons)
    return done, skipped


def _remove_partial(partial: Path) -> None:
    """Delete a stale partial build, but only if it looks like one of ours."""
    ours = {PLAN, JOURNAL, PLAN + ".tmp", MANIFEST, MANIFEST + ".tmp", SKIPPED, "panels.npy", "targets.npy", "meta.npy",
            "meta.npy.tmp", "meta_target.npy", "valid.npy", "groups.npy", "splits.npy", "file_ids.npy", CACHE_ARRAY}
    strangers = [p.name for p in partial.iterdir() if p.name not in ours]
    if strangers:
        raise DataFormatError(f"{partial}: unexpected files {strangers} in the partial cache folder; remove it by hand")
    shutil.rmtree(partial)


def prepare_cache(
    root: str | Path,
    out: str | Path,
    size: int = 80,
    workers: int = 1,
    kind: str = "raven",
    on_error: str = "stop",
    *,
    resize: str = "area",
    configurations: Sequence[str] | None = None,
    regimes: Sequence[str] | None = None,
    chunk_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
    show_progress: bool = True,
) -> Path:
    """Convert a raw dataset folder into a memory-mapped cache of ``size`` px panels (all splits).

    Args:
        root: raw RAVEN / I-RAVEN folder (``<root>/<configuration>/RAVEN_<k>_<split>.npz``) or PGM folder.
        out: cache folder to create (it is built in ``<out>.partial`` and renamed when complete).
        size: panel side in px after resizing (160 keeps the originals).
        workers: processes converting files in parallel (1 = in this process).
        kind: ``"raven"`` or ``"pgm"``.
        on_error: ``"stop"`` raises ``DataFormatError`` at the first bad file (finished chunks are kept and
            a rerun resumes); ``"skip"`` leaves the row invalid, lists the file and reason in
            ``<out>/skipped.txt`` and prints the count.
        resize: ``"area"`` (2x2 mean for 160 -> 80) or ``"stride"`` (every 2nd pixel, MLCL's PGM parity).
        configurations: RAVEN only: folder or short names to include (default: every folder present).
        regimes: PGM only: regimes to include (default: every regime found).
        chunk_size: files per unit of work and of resumable progress.
        progress: called as ``progress(files_done, files_total)`` after each finished chunk.
        show_progress: show a tqdm bar on stderr.

    Returns:
        ``Path(out)``. When ``out`` already holds a complete cache of the same inputs and settings it is
        returned untouched.

    Raises:
        DataFormatError: bad root / files (see ``find_raven_files``, ``load_raven_npz``), or ``out`` exists
        and is something else.
    """
    spec = kind_spec(kind)
    check_resize(resize)
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {list(ON_ERROR)}, got {on_error!r}")
    if size < 1 or workers < 1 or chunk_size < 1:
        raise ValueError(f"size, workers and chunk_size must be >= 1 (got {size}, {workers}, {chunk_size})")
    root = Path(root).resolve()
    if kind == "raven":
        if regimes is not None:
            raise ValueError("regimes= applies to kind='pgm' only")
        files = find_raven_files(root, configurations)
    else:
        if configurations is not None:
            raise ValueError("configurations= applies to kind='raven' only")
        files = find_pgm_files(root, regimes)
    plan = _plan(kind, root, files, size, resize, chunk_size)
    regime = _source_regime(root) if kind == "raven" else None
    build_cache(out, files, plan, FileRecords(kind), kind=kind, regime=regime, workers=workers, on_error=on_error,
                progress=progress, show_progress=show_progress)
    return Path(out)


def cache_destination(out: str | Path) -> Path:
    """Where a build into ``out`` puts its cache: ``out``, or the folder a symbolic link at ``out`` points to
    (existing or not), so a link to a big scratch disk gets the cache there. The build works in a ``.partial``
    folder beside the destination and renames it onto it: beside the link it would fill the link's disk, and no
    rename can replace a link by a folder, so every build into a link failed at its very end, every time."""
    out = Path(out)
    return out.resolve() if out.is_symlink() else out


def check_cache_fits(out: str | Path, rows: int, size: int, writer: str) -> None:
    """Refuse (``NotEnoughSpaceError``, one line) a cache of ``rows`` rows at ``size`` px whose panels alone cannot
    fit, before a caller lists its rows: ``rpm-generate --cache-size`` makes one record per requested problem, which
    for a request far beyond the disk (10**8 problems per configuration) is gigabytes of memory and minutes of
    silence before the build's own, exact check refuses it. A lower bound: what ``out`` and its ``.partial``
    folder already hold counts as written, so a finished cache or an interrupted build is never refused here."""
    out = cache_destination(out)
    there = 0
    for folder in (out, out.with_name(out.name + ".partial")):
        if folder.is_dir() and not folder.is_symlink():
            there += sum(f.stat().st_blocks * 512 for f in folder.iterdir() if f.is_file() and not f.is_symlink())
    row = NUM_PANELS * size * size
    needed = rows * row - there  # integers: a typed count of 10**400 must not overflow a float
    if needed > 0:
        check_free_space(out, needed, writer, f"{rows:,} problems to write, ~{row // 1000:,} kB each")


def build_cache(out: str | Path, files: list[RawFile], plan: dict, source: Callable[[RawFile], RpmRecord], *,
                kind: str = "raven", regime: dict | None = None, workers: int = 1, on_error: str = "stop",
                progress: Callable[[int, int], None] | None = None, show_progress: bool = True,
                writer: str = "rpm-data prepare") -> int:
    """Build (or resume, or find up to date) the cache ``out`` with one row per ``files`` entry, in that order.

    What :func:`prepare_cache` does once it has listed and planned a raw folder; ``rpm-generate --cache-size``
    calls it with problems that never become files.

    Args:
        files: the rows: ``file.group``, ``file.split`` and ``file.file_id`` fill the row index arrays; the
            source turns each into its problem.
        plan: what the cache is built from and how (``image_size``, ``resize``, ``chunk_size`` and the input
            keys that say whether an existing cache or an interrupted build is of the same inputs); stored in
            the manifest.
        source: ``source(file) -> RpmRecord``, called in worker processes (so it must pickle); its
            ``DataFormatError`` / ``ValueError`` stops the build or skips the row (``on_error``).
        regime: recorded as the manifest's ``regime``.
        writer: the program named by the one-writer lock's refusal.

    Returns:
        The rows converted by this call (0 when the cache was already complete).
    """
    spec = kind_spec(kind)
    # file_ids.npy is int64, and a file name has no such limit (rpm-generate --start 2**63 writes one): named here,
    # before anything is made, instead of an OverflowError from numpy half-way through allocating the build.
    too_big = next((f for f in files if f.file_id > np.iinfo(np.int64).max), None)
    if too_big is not None:
        raise DataFormatError(f"{too_big.path}: problem index {too_big.file_id} is past 2**63 - 1, the largest a cache "
                              "stores (int64)")
    out = cache_destination(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # One writer per cache: a second writer into the same --out is refused, naming the first. The lock sits
    # beside <out> (which is built as <out>.partial and renamed), so the messages name <out>, not its parent.
    with exclusive_writer(out.with_name(out.name + ".lock"), writer, folder=out):
        return _build_locked(out, files, plan, source, spec, regime, workers, on_error, progress, show_progress,
                             writer)


def _build_locked(out: Path, files: list[RawFile], plan: dict, source: Callable[[RawFile], RpmRecord], spec: _Kind,
                  regime: dict | None, workers: int, on_error: str, progress: Callable[[int, int], None] | None,
                  show_progress: bool, writer: str) -> int:
    partial = out.with_name(out.name + ".partial")
    size, resize, chunk_size = plan["image_size"], plan["resize"], plan["chunk_size"]

    if is_cache(out):
        manifest = read_manifest(out)
        previous = manifest.get("plan") if isinstance(manifest.get("plan"), dict) else {}
        if _same_inputs(previous, plan):
            check_cache(out, manifest)  # "up to date" only for a cache that is also intact
            print(f"{out}: cache is complete and up to date", file=sys.stderr)
            if not _same_opencv(previous, plan):  # a finished cache is whole as it is: kept, but said
                print(f"{out}: note: its pixels were {opencv_version.describe(opencv_version.recorded(out))}; this "
                      f"OpenCV ({opencv_version.current()}) would make some pixels differently, so its data "
                      "fingerprint differs from a cache made here", file=sys.stderr)
            return 0
        if "content_sha256" not in previous:
            raise DataFormatError(f"{out}: a cache built by an older rpm_lib, which did not record its input files' "
                                  "sizes and times, so it cannot be checked; delete it or choose another --out")
        raise DataFormatError(f"{out}: a cache built from other inputs or settings exists (differs in "
                              f"{_differences(previous, plan)}); delete it or choose another --out")
    if out.exists():
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        else:
            raise DataFormatError(f"{out}: exists and is not an rpm_lib cache; refusing to overwrite it")

    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        what = "a symbolic link" if partial.is_symlink() else "not a folder"
        raise DataFormatError(f"{partial}: exists and is {what} ({writer} builds {out} in a folder there); remove it "
                              "and rerun")
    if partial.exists():
        previous = _partial_plan(partial)
        if previous is not None and (not _same_inputs(previous, plan) or not _same_opencv(previous, plan)
                                     or previous.get("chunk_size") != chunk_size):
            print(f"{partial}: discarding an interrupted build of other inputs/settings", file=sys.stderr)
            _remove_partial(partial)
        elif damage := (f"{PLAN}: missing or unreadable" if previous is None
                        else _partial_damage(partial, spec, plan)):
            print(f"{partial}: discarding an interrupted build that cannot be continued ({damage})", file=sys.stderr)
            _remove_partial(partial)
        elif is_cache(partial):  # finished, killed while tidying up or before the rename
            for name in (PLAN, JOURNAL):
                (partial / name).unlink(missing_ok=True)
            os.rename(partial, out)
            return 0
    # Memory-mapped outputs are sparse files: without this check a full disk shows up as SIGBUS mid-build.
    row_bytes = NUM_PANELS * size * size + 8 + int(np.prod(spec.build_meta_shape)) + spec.meta_target_dim + 1
    resuming = partial.exists()
    if not resuming:
        check_free_space(partial, len(files) * row_bytes, writer)
        _allocate(partial, spec, files, size, plan)

    done, skipped = _read_journal(partial)
    if resuming:
        rows_left = len(files) - sum(min(chunk_size, len(files) - i * chunk_size) for i in done)
        check_free_space(partial, rows_left * row_bytes, writer)
    starts = range(0, len(files), chunk_size)
    chunks = [
        _Chunk(i, start, files[start : start + chunk_size], spec.name, size, resize, str(partial / "panels.npy"),
               on_error, source)
        for i, start in enumerate(starts)
        if i not in done
    ]
    files_done = len(files) - sum(len(c.files) for c in chunks)
    converted = 0
    labels = {name: np.load(partial / f"{name}.npy", mmap_mode="r+")
              for name in ("targets", "meta", "meta_target", "valid", "problem_hashes")}
    bar = tqdm(total=len(files), initial=files_done, unit="RPM", desc=f"{writer.split()[-1]} {out.name}", disable=not show_progress)
    try:
        with open(partial / JOURNAL, "a") as journal:

            def record(result: _ChunkResult) -> None:
                nonlocal files_done, converted
                rows = slice(result.start, result.start + len(result.ok))
                labels["targets"][rows] = result.targets
                labels["meta"][rows] = result.meta
                labels["meta_target"][rows] = result.meta_target
                labels["valid"][rows] = result.ok
                labels["problem_hashes"][rows] = result.hashes
                for array in labels.values():
                    array.flush()
                journal.write(json.dumps({"chunk": result.chunk_id, "skipped": result.skipped}) + "\n")
                journal.flush()
                os.fsync(journal.fileno())
                skipped.extend(result.skipped)
                files_done += len(result.ok)
                converted += len(result.ok)
                bar.update(len(result.ok))
                if progress is not None:
                    progress(files_done, len(files))

            if workers == 1 or len(chunks) <= 1:
                for chunk in chunks:
                    record(_convert_chunk(chunk))
            else:
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
                context = multiprocessing.get_context(method)
                # An executor, not multiprocessing.Pool: a worker killed by a signal (SIGBUS when a memory map
                # cannot get disk blocks) breaks the executor with an error instead of hanging the pool.
                with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context,
                                         initializer=_init_worker) as executor:
                    try:
                        for future in as_completed([executor.submit(_convert_chunk, c) for c in chunks]):
                            record(future.result())
                    except BrokenProcessPool:
                        raise RuntimeError(f"{out}: a worker process died (killed by a signal; a full disk does "
                                           "this through the memory map); finished chunks are kept and a rerun "
                                           "resumes") from None
    finally:
        bar.close()
        labels.clear()  # drop the memmaps before the folder is renamed

    _finish(partial, out, spec, plan, skipped, on_error, regime)
    if on_error == "skip":
        print(f"skipped {len(skipped)} file(s); see {out / SKIPPED}", file=sys.stderr)
    return converted


def _source_regime(root: Path) -> dict | None:
    """The checked ``regime.json`` of the raw folder a cache is built from (None when it has none), recorded in the
    manifest so that the cache keeps its regime when the raw folder is gone or regenerated with another one."""
    from rpm_lib.generator.writer import GeneratorSettingsError, read_regime_record

    try:
        return read_regime_record(root)
    except GeneratorSettingsError as error:
        raise DataFormatError(str(error)) from None


def _partial_plan(partial: Path) -> dict | None:
    """The plan an interrupted build was made for: its ``plan.json``, or, once it finished and was killed while
    tidying up (plan gone, manifest written), its manifest's ``plan``; None when neither can be read."""
    for name in (PLAN, MANIFEST):
        try:
            data = json.loads((partial / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and name == MANIFEST:
            data = data.get("plan")
        if isinstance(data, dict):
            return data
    return None


def _partial_damage(partial: Path, spec: _Kind, plan: dict) -> str | None:
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
    finished = set(range(-(-n // chunk_size))) <= _read_journal(partial)[0]
    expected = {name: (dtype, {shape}) for name, (dtype, shape) in _build_layout(n, size, spec).items()}
    if finished:  # _trim_meta may already have cut meta.npy to the plain rows
        expected["meta.npy"][1].add((n, *spec.meta_shape))
    for name, (dtype, shapes) in expected.items():
        file = partial / name
        if not file.is_file():
            return f"{name}: missing"
        try:
            shape, found, offset = _array_header(file)
        except (OSError, ValueError, EOFError) as error:
            return f"{name}: not a readable .npy array ({str(error).splitlines()[0]})"
        if tuple(shape) not in shapes or found != np.dtype(dtype):
            return f"{name}: {found} {tuple(shape)}, not what this build makes"
        needed = offset + int(np.prod(tuple(shape), dtype=np.int64)) * found.itemsize
        if file.stat().st_size < needed:
            return f"{name}: truncated to {file.stat().st_size} of its {needed} bytes"
    return None


def _trim_meta(partial: Path, spec: _Kind) -> int:
    """Keep ``meta.npy``'s Mesh rows only when a problem has a Mesh; returns the rows kept (manifest ``meta_rows``).

    The build stores room for a Mesh in every row because it cannot know in advance whether a file has one;
    a cache without any keeps the plain (N, 8, 9) layout, so plain caches are what they always were.
    """
    meta = np.load(partial / "meta.npy")
    rows = spec.meta_shape[0]
    if meta.shape[1] == rows or meta[:, rows:].any():
        return int(meta.shape[1])
    tmp = partial / "meta.npy.tmp"
    with open(tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(meta[:, :rows]))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, partial / "meta.npy")
    return rows


def _finish(partial: Path, out: Path, spec: _Kind, plan: dict, skipped: list[tuple[str, str]], on_error: str,
            regime: dict | None) -> None:
    """Write the report and the manifest, drop the journal, rename the partial folder."""
    if on_error == "skip":
        lines = "".join(f"{path}\t{reason}\n" for path, reason in sorted(skipped))
        (partial / SKIPPED).write_text(lines)
    meta_rows = _trim_meta(partial, spec)
    groups = np.load(partial / "groups.npy")
    splits = np.load(partial / "splits.npy")
    valid = np.load(partial / "valid.npy")
    counts: dict[str, dict[str, int]] = {}
    for g in np.unique(groups):
        counts[spec.groups[g]] = {s: int(((groups == g) & (splits == i) & valid).sum()) for i, s in enumerate(SPLITS)}
    manifest = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "kind": spec.name,
        "image_size": plan["image_size"],
        "resize": plan["resize"],
        "num_rows": plan["num_rows"],
        "num_valid": int(valid.sum()),
        "num_skipped": len(skipped),
        "group_names": list(spec.groups),
        "meta_rows": meta_rows,
        "counts": counts,
        "plan": plan,
        "problem_hashes": HASH_METHOD,
        "regime": regime,
    }
    # The manifest first, then the tidying up: a build killed in between is found finished by the next run (its
    # plan in the manifest), not discarded as one whose plan is unknown.
    _write_json_atomic(partial / MANIFEST, manifest)
    for name in (PLAN, JOURNAL):
        (partial / name).unlink()
    os.rename(partial, out)


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

#: What ``manifest.json`` must hold for a reader: field -> (type, description for the error).
_MANIFEST_FIELDS: dict[str, tuple[type, str]] = {
    "kind": (str, "a dataset kind"), "image_size": (int, "a panel size in px"), "resize": (str, "a resize method"),
    "num_rows": (int, "a row count"), "group_names": (list, "a list of names"), "plan": (dict, "the build plan"),
}


def _array_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset in bytes) of an ``.npy`` file, read from its header only.

    Raises:
        ValueError: a damaged header (numpy parses it as Python literal text, which fails in several ways).
    """
    import tokenize

    with path.open("rb") as handle:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        try:
            shape, _fortran, dtype = read(handle)
        except (SyntaxError, tokenize.TokenError) as error:
            raise ValueError(f"damaged header ({type(error).__name__})") from None
        return shape, dtype, handle.tell()


def check_cache(path: str | Path, manifest: dict) -> dict[str, np.ndarray]:
    """Check a complete cache against its manifest before anything reads it: manifest fields and types, every
    array's presence, header, shape, dtype and byte size, and the label values (group, split and answer ids).

    Returns:
        The label arrays (``groups``, ``splits``, ``file_ids``, ``valid``, ``targets``, ``meta``,
        ``meta_target``), loaded.

    Raises:
        DataFormatError: one line naming the file and the field or array that is wrong.
    """
    path = Path(path)
    where = path / MANIFEST
    for field, (kind, description) in _MANIFEST_FIELDS.items():
        value = manifest.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataFormatError(f"{where}: field {field!r} must be {description} ({kind.__name__}), got {value!r}")
    if manifest["kind"] not in KINDS:
        raise DataFormatError(f"{where}: field 'kind' must be one of {list(KINDS)}, got {manifest['kind']!r}")
    spec = KINDS[manifest["kind"]]
    n, size = manifest["num_rows"], manifest["image_size"]
    if n < 0 or size < 1:
        raise DataFormatError(f"{where}: fields 'num_rows' ({n}) and 'image_size' ({size}) must be >= 0 and >= 1")
    if list(manifest["group_names"]) != list(spec.groups):
        raise DataFormatError(f"{where}: field 'group_names' does not match the {spec.name} groups of this version")
    # Caches written before the field existed are plain (8-row RAVEN) ones.
    meta_rows = manifest.get("meta_rows", spec.meta_shape[0])
    if not isinstance(meta_rows, int) or isinstance(meta_rows, bool) or meta_rows not in spec.meta_rows:
        raise DataFormatError(f"{where}: field 'meta_rows' must be one of {list(spec.meta_rows)} for a {spec.name} "
                              f"cache, got {meta_rows!r}")
    expected = {
        "panels": (np.uint8, (n, NUM_PANELS, size, size)),
        "groups": (None, (n,)), "splits": (None, (n,)), "file_ids": (None, (n,)), "valid": (np.bool_, (n,)),
        "targets": (None, (n,)), "meta": (np.uint8, (n, meta_rows, *spec.meta_shape[1:])),
        "meta_target": (np.uint8, (n, spec.meta_target_dim)),
    }
    # Caches built before these fields existed have no problem hashes and no recorded regime.
    method = manifest.get("problem_hashes")
    if method is not None:
        if method != HASH_METHOD:
            raise DataFormatError(f"{where}: field 'problem_hashes' must be {HASH_METHOD!r}, got {method!r}")
        expected["problem_hashes"] = (np.uint8, (n, HASH_BYTES))
    if not isinstance(manifest.get("regime"), (dict, type(None))):
        raise DataFormatError(f"{where}: field 'regime' must be the regime.json object or null, got "
                              f"{manifest['regime']!r}")
    # A cache made by rpm-generate --cache-size has no raw folder to prepare again: name the command that made it.
    rebuild = "rpm-generate --cache-size" if isinstance(manifest["plan"].get("generator"), dict) else "rpm-data prepare"
    for name, (dtype, shape) in expected.items():
        file = path / f"{name}.npy"
        if not file.is_file():
            raise DataFormatError(f"{file}: missing (the cache is incomplete; delete it and rebuild it with "
                                  f"`{rebuild}`)")
        try:
            found_shape, found_dtype, offset = _array_header(file)
        except (ValueError, OSError, EOFError) as error:
            raise DataFormatError(f"{file}: not a readable .npy array ({str(error).splitlines()[0]})") from None
        if tuple(found_shape) != shape:
            fields = f"num_rows={n}, image_size={size}" + (f", meta_rows={meta_rows}" if name == "meta" else "")
            raise DataFormatError(f"{file}: shape {tuple(found_shape)}, but {MANIFEST} ({fields}) needs {shape}")
        if dtype is not None and found_dtype != np.dtype(dtype):
            raise DataFormatError(f"{file}: dtype {found_dtype}, expected {np.dtype(dtype)}")
        # Any integer width is accepted for the ids and answers, nothing else: a float would be truncated into
        # another id unseen, and an object array is a pickle (refused by np.load, as a traceback, below).
        if dtype is None and not np.issubdtype(found_dtype, np.integer):
            raise DataFormatError(f"{file}: dtype {found_dtype}, expected an integer array")
        needed = offset + int(np.prod(shape, dtype=np.int64)) * found_dtype.itemsize
        actual = file.stat().st_size
        if actual < needed:
            raise DataFormatError(f"{file}: truncated: {actual} bytes, {needed} needed for shape {shape}")
    arrays = {name: np.load(path / f"{name}.npy") for name in expected if name != "panels"}
    for name, limit in (("groups", len(spec.groups)), ("splits", len(SPLITS))):
        values = arrays[name]
        if len(values) and (values.min() < 0 or values.max() >= limit):
            bad = int(values[(values < 0) | (values >= limit)][0])
            raise DataFormatError(f"{path / f'{name}.npy'}: id {bad} outside 0..{limit - 1}")
    targets = arrays["targets"][arrays["valid"]]
    if len(targets) and (targets.min() < 0 or targets.max() > 7):
        raise DataFormatError(f"{path / 'targets.npy'}: answer index outside 0..7 in a valid row")
    return arrays


def _file_identity(path: Path) -> tuple[int, ...]:
    """Device, inode, size and modification time of ``path``: any of them differs once it is replaced or rewritten."""
    status = path.stat()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


class CacheReader:
    """Read access to a complete cache: label arrays in RAM, panels memory-mapped on first use (per process).

    Args:
        path: the cache folder.
        kind: expected kind (``"raven"`` / ``"pgm"``).
        image_size: requested panel size; must equal the cache's.
        resize: requested resize method; must equal the cache's.

    Raises:
        DataFormatError: incomplete cache, other kind, size or resize method.
    """

    def __init__(self, path: str | Path, kind: str, image_size: int, resize: str) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.spec = kind_spec(kind)
        for field in ("kind", "image_size", "resize"):  # compared below, before the whole cache is checked
            if field not in self.manifest:
                raise DataFormatError(f"{self.path / MANIFEST}: field {field!r} missing")
        if self.manifest["kind"] != kind:
            raise DataFormatError(f"{self.path}: this is a {self.manifest['kind']} cache, not a {kind} one")
        if self.manifest["image_size"] != image_size:
            raise DataFormatError(
                f"{self.path}: cache built for image_size={self.manifest['image_size']} cannot serve image_size={image_size}; "
                f"use image_size={self.manifest['image_size']}, {self._other_size_hint(image_size)}"
            )
        if self.manifest["resize"] != resize:
            raise DataFormatError(
                f"{self.path}: cache built with resize={self.manifest['resize']!r}, requested resize={resize!r}"
            )
        arrays = check_cache(self.path, self.manifest)
        self.groups = arrays["groups"].astype(np.int64)
        self.splits = arrays["splits"].astype(np.int64)
        self.file_ids = arrays["file_ids"]
        self.valid = arrays["valid"]
        self.targets = arrays["targets"]
        self.meta = arrays["meta"]
        self.meta_target = arrays["meta_target"]
        #: uint8 (N, 16) content hashes of the rows' original panels; None for a cache built before they existed.
        self.problem_hashes: np.ndarray | None = arrays.get("problem_hashes")
        #: what ``panels.npy`` was when the labels were read: each process maps it anew (see ``panels``)
        self._panels_identity: tuple[int, ...] | None = _file_identity(self.path / "panels.npy")
        self._panels: np.ndarray | None = None
        self._panels_pid: int | None = None

    def _other_size_hint(self, image_size: int) -> str:
        plan = self.manifest["plan"]
        if isinstance(plan.get("generator"), dict):  # no raw folder: made by rpm-generate --cache-size
            return f"or generate another cache with `rpm-generate --cache-size {image_size}` ({plan['source_root']})"
        return f"the raw folder {plan['source_root']}, or build another cache with `rpm-data prepare --size {image_size}`"

    def select(self, group_names: Sequence[str], split: str) -> np.ndarray:
        """int64 rows of valid problems of ``split`` for each group in the given order, by file id."""
        split_index = SPLITS.index(split)
        parts = []
        for name in group_names:
            g = self.spec.groups.index(name)
            rows = np.flatnonzero((self.groups == g) & (self.splits == split_index) & self.valid)
            if len(rows) == 0:
                present = [n for i, n in enumerate(self.spec.groups) if ((self.groups == i) & self.valid).any()]
                field = "configurations" if self.spec.name == "raven" else "pgm_regime"
                raise DataFormatError(f"{self.path}: the cache has no {name!r} problems for split {split!r}; it "
                                      f"holds {', '.join(present) or 'nothing'} (choose those with {field}=)")
            parts.append(rows[np.argsort(self.file_ids[rows], kind="stable")])
        return np.concatenate(parts)

    def source_id(self, row: int) -> str:
        return self.spec.source_id(self.spec.groups[self.groups[row]], int(self.file_ids[row]), SPLITS[self.splits[row]])

    def panels(self, row: int) -> np.ndarray:
        """uint8 (16, S, S) copy of a row (file answer order)."""
        if self._panels is None or self._panels_pid != os.getpid():
            # A DataLoader worker maps the file when it starts (each epoch, without persistent workers), maybe long
            # after the labels were read: a cache deleted and made again, or rewritten, since then would give its
            # panels beside the old labels, silently. The process that mapped it first keeps the file it mapped.
            file = self.path / "panels.npy"
            try:
                identity = _file_identity(file)
            except FileNotFoundError:
                identity = None
            if identity != self._panels_identity:
                raise DataFormatError(f"{file}: changed since the dataset was opened (deleted, replaced or "
                                      "rewritten); its labels were read from the old one, so the run cannot go on: "
                                      "restart it")
            self._panels = np.load(file, mmap_mode="r")
            self._panels_pid = os.getpid()
        return np.array(self._panels[row])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_panels"] = None  # re-mapped in the receiving process
        return state
