"""Building a cache (``build_cache``): allocate ``<out>.partial/``, convert its rows chunk by chunk in worker
processes (journaled, so a rerun resumes), then write the manifest and rename the folder to ``<out>``.

Workers (processes) write disjoint row ranges of the same memory-mapped ``panels.npy``; nothing holds the whole
dataset in RAM. Only a complete build gets a manifest and is renamed, so an interrupted run never leaves something
that looks complete.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.atomic_files import write_atomically
from rpm_lib.data.cache.format import (CACHE_FORMAT, CACHE_VERSION, INDEX_ARRAYS, JOURNAL, KINDS, MANIFEST, PLAN,
                                       SKIPPED, Kind, build_layout, check_cache, is_cache, kind_spec, read_manifest)
from rpm_lib.data.cache.partial import partial_damage, partial_plan, read_journal, remove_partial
from rpm_lib.data.cache.plan import plan_differences, same_inputs, same_opencv
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import HASH_BYTES, METHOD as HASH_METHOD, panels_hash
from rpm_lib.data.raw_files import SPLITS, RawFile
from rpm_lib.data.resize import resize_panels
from rpm_lib.data.validation import NUM_PANELS, RpmRecord
from rpm_lib.folder_lock import check_free_space, exclusive_writer
from rpm_lib.json_files import write_object


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


def _allocate(partial: Path, spec: Kind, files: list[RawFile], size: int, plan: dict) -> None:
    """Create the partial folder: row index arrays, empty memory-mapped outputs, then the plan."""
    partial.mkdir(parents=True)
    layout = build_layout(len(files), size, spec)
    index_values = {"groups.npy": [spec.groups.index(f.group) for f in files],
                    "splits.npy": [SPLITS.index(f.split) for f in files],
                    "file_ids.npy": [f.file_id for f in files]}
    for name in INDEX_ARRAYS:
        np.save(partial / name, np.array(index_values[name], dtype=layout[name][0]))
    outputs = {name: layout[name] for name in layout if name not in INDEX_ARRAYS}
    for name, (dtype, shape) in outputs.items():
        array = np.lib.format.open_memmap(partial / name, mode="w+", dtype=dtype, shape=shape)
        array.flush()
        del array
    (partial / JOURNAL).touch()
    write_object(partial / PLAN, plan)  # last: its presence means the folder is fully allocated


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


def _build_locked(out: Path, files: list[RawFile], plan: dict, source: Callable[[RawFile], RpmRecord], spec: Kind,
                  regime: dict | None, workers: int, on_error: str, progress: Callable[[int, int], None] | None,
                  show_progress: bool, writer: str) -> int:
    partial = out.with_name(out.name + ".partial")
    size, resize, chunk_size = plan["image_size"], plan["resize"], plan["chunk_size"]

    if is_cache(out):
        manifest = read_manifest(out)
        previous = manifest.get("plan") if isinstance(manifest.get("plan"), dict) else {}
        if same_inputs(previous, plan):
            check_cache(out, manifest)  # "up to date" only for a cache that is also intact
            print(f"{out}: cache is complete and up to date", file=sys.stderr)
            if not same_opencv(previous, plan):  # a finished cache is whole as it is: kept, but said
                print(f"{out}: note: its pixels were {opencv_version.describe(opencv_version.recorded(out))}; this "
                      f"OpenCV ({opencv_version.current()}) would make some pixels differently, so its data "
                      "fingerprint differs from a cache made here", file=sys.stderr)
            return 0
        if "content_sha256" not in previous:
            raise DataFormatError(f"{out}: a cache built by an older rpm_lib, which did not record its input files' "
                                  "sizes and times, so it cannot be checked; delete it or choose another --out")
        raise DataFormatError(f"{out}: a cache built from other inputs or settings exists (differs in "
                              f"{plan_differences(previous, plan)}); delete it or choose another --out")
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
        previous = partial_plan(partial)
        if previous is not None and (not same_inputs(previous, plan) or not same_opencv(previous, plan)
                                     or previous.get("chunk_size") != chunk_size):
            print(f"{partial}: discarding an interrupted build of other inputs/settings", file=sys.stderr)
            remove_partial(partial)
        elif damage := (f"{PLAN}: missing or unreadable" if previous is None
                        else partial_damage(partial, spec, plan)):
            print(f"{partial}: discarding an interrupted build that cannot be continued ({damage})", file=sys.stderr)
            remove_partial(partial)
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

    done, skipped = read_journal(partial, -(-len(files) // chunk_size))
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
    # disable=None: tqdm draws the bar on a terminal only (a log file or a SLURM output would get every redraw)
    bar = tqdm(total=len(files), initial=files_done, unit="RPM", desc=f"{writer.split()[-1]} {out.name}",
               disable=None if show_progress else True)
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


def _trim_meta(partial: Path, spec: Kind) -> int:
    """Keep ``meta.npy``'s Mesh rows only when a problem has a Mesh; returns the rows kept (manifest ``meta_rows``).

    The build stores room for a Mesh in every row because it cannot know in advance whether a file has one;
    a cache without any keeps the plain (N, 8, 9) layout, so plain caches are what they always were.
    """
    meta = np.load(partial / "meta.npy")
    rows = spec.meta_shape[0]
    if meta.shape[1] == rows or meta[:, rows:].any():
        return int(meta.shape[1])
    write_atomically(partial / "meta.npy", lambda handle: np.save(handle, np.ascontiguousarray(meta[:, :rows])),
                     fsync=True)
    return rows


def _finish(partial: Path, out: Path, spec: Kind, plan: dict, skipped: list[tuple[str, str]], on_error: str,
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
    write_object(partial / MANIFEST, manifest)
    for name in (PLAN, JOURNAL):
        (partial / name).unlink()
    os.rename(partial, out)
