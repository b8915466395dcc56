"""Writing generated problems to disk in the released RAVEN / I-RAVEN layout (docs/data-formats.md).

``<root>/<configuration>/RAVEN_<k>_<split>.npz`` (+ ``.xml``), split by ``k % 10`` in tenths
(``regimes.split_of``; ``val``/``test`` default 2/2: 0-5 train, 6-7 val, 8-9 test). What the .npz holds and why its
bytes are deterministic: ``rpm_lib.generator.npz_files``.

Crash safety and resuming: each file is written to a hidden temporary name in the same folder and
moved into place with ``os.replace`` - the .npz first, the .xml last - so a file under its final name
is always complete and "the .xml exists" means the problem is finished. A problem is considered done
when its .npz has exactly the expected size and (unless ``write_xml=False``) its .xml ends with
``</Data>``; everything else is regenerated (deterministically, to the same bytes).

Regimes (docs/generator.md, "Generalisation regimes"): ``write_dataset(..., regime=, val=, test=)`` gives each
problem the split it is filed under, so a held-out group follows the train rule in ``_train``/``_val`` files
and another rule in ``_test`` files. The file format stays I-RAVEN's (8-row ``meta_matrix``) for every
Attributeless regime -- a deliberate difference from raven-datasets, whose files always have 12 rows. The
regime is recorded in ``regime.json`` and, with seed, mode and split proportions, in ``generator.json``
(``rpm_lib.data.records``; content and checks: ``rpm_lib.generator.settings``), which refuses a resumed write with
other settings.

I-RAVEN-Mesh (``regime.mesh``; docs/generator.md, "Mesh") uses raven-datasets' label layout: ``meta_matrix``
(12, 9) with the Mesh's rules in rows 8..11, ``structure`` with the Mesh tokens (``labels``); still no
``meta_answer_mods`` (it marks the answer). Its .npz sizes are fixed too (``expected_npz_size(c, mesh=True)``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from rpm_lib.atomic_files import TEMP_SUFFIX, write_atomically
from rpm_lib.data.cache import is_cache
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import (RAW_RECORD, note, panels_hash, raw_hashes, read_raw_record,
                                         write_raw_record)
from rpm_lib.data.validation import load_raven_npz
from rpm_lib.folder_lock import check_free_space, exclusive_writer
from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.candidates import check_mode
from rpm_lib.generator.npz_files import expected_npz_size, npz_arrays, write_npz
from rpm_lib.generator.problem import Problem
from rpm_lib.generator.regimes import Regime, resolve_regime, split_of
from rpm_lib.generator.settings import check_renderer, check_settings
from rpm_lib.generator.xml_io import problem_xml
from rpm_lib.rules import resolve_configurations

#: The write lock of a generated folder (see rpm_lib.folder_lock).
LOCK_FILE = ".rpm-generate.lock"

# The temporary files of problems (``rpm_lib.atomic_files.temporary_name``), cleared when a write resumes.
_TEMP_PREFIX = ".RAVEN_"

# ``split_of(index, val=2, test=2)`` is defined in ``regimes`` (the generator needs it too) and re-exported here.


def problem_stem(root: str | os.PathLike, configuration: str, index: int, val: int = 2, test: int = 2) -> Path:
    """``<root>/<configuration>/RAVEN_<index>_<split>`` (add ``.npz`` / ``.xml``); split ``split_of(index, val,
    test)``."""
    return Path(root) / configuration / f"RAVEN_{index}_{split_of(index, val, test)}"


# ---------------------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------------------


def write_problem(
    problem: Problem, stem: str | os.PathLike, image: np.ndarray | None = None, write_xml: bool = True
) -> bytes:
    """Write ``<stem>.npz`` (and ``<stem>.xml``) for ``problem``, each atomically, the .npz first.

    ``stem`` is e.g. ``problem_stem(root, configuration, k)``; its folder must exist. Returns the problem's
    content hash (``rpm_lib.data.problem_hashes.panels_hash`` of its image).
    """
    stem = Path(stem)
    arrays = npz_arrays(problem, image)
    xml = problem_xml(problem).encode("ascii") if write_xml else None
    write_atomically(stem.with_name(stem.name + ".npz"), lambda handle: write_npz(arrays, handle))
    if xml is not None:
        write_atomically(stem.with_name(stem.name + ".xml"), lambda handle: handle.write(xml))
    return panels_hash(arrays["image"])


def is_complete(stem: str | os.PathLike, configuration: str, write_xml: bool = True, mesh: bool = False) -> bool:
    """Whether ``stem`` holds a finished problem: .npz of the exact expected size (with the Mesh's labels when
    ``mesh``), and .xml ending in ``</Data>``."""
    stem = Path(stem)
    try:
        if os.stat(stem.with_name(stem.name + ".npz")).st_size != expected_npz_size(configuration, mesh):
            return False
        if not write_xml:
            return True
        xml_path = stem.with_name(stem.name + ".xml")
        size = os.stat(xml_path).st_size
        if size < 7:
            return False
        with open(xml_path, "rb") as handle:
            handle.seek(size - 7)
            return handle.read() == b"</Data>"
    except FileNotFoundError:
        return False


def remove_stale_temporaries(folder: str | os.PathLike) -> int:
    """Delete temporary files left by a killed writer in ``folder``; returns how many were removed.

    Do not run two writers on the same output folder at once: each clears the other's temporaries.
    """
    removed = 0
    folder = Path(folder)
    if folder.is_dir():
        for path in folder.glob(f"{_TEMP_PREFIX}*{TEMP_SUFFIX}"):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


# ---------------------------------------------------------------------------------------------------
# A whole set
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Consecutive problems ``start .. stop - 1`` of one configuration (the unit of work of a worker)."""

    configuration: str
    start: int
    stop: int


@dataclass(frozen=True)
class WriteJob:
    """Everything a worker needs to write a chunk (picklable, so it works with the spawn start method)."""

    root: str
    seed: int
    mode: str
    write_xml: bool
    regime: Regime | None = None
    val: int = 2
    test: int = 2


def pending_chunks(
    root: str | os.PathLike,
    configurations: Iterable[str],
    count: int,
    start: int = 0,
    write_xml: bool = True,
    chunk_size: int = 25,
    val: int = 2,
    test: int = 2,
    mesh: bool = False,
) -> tuple[list[Chunk], int]:
    """The chunks of not-yet-complete problems ``start .. start + count - 1`` and how many are done."""
    chunks: list[Chunk] = []
    done = 0
    for configuration in configurations:
        # One listing instead of a failing stat per absent problem: ~25 us per requested problem otherwise,
        # minutes of silence before a large write into a new folder.
        present = _npz_names(Path(root) / configuration)
        run: list[int] = []
        for index in range(start, start + count):
            if (f"RAVEN_{index}_{split_of(index, val, test)}.npz" in present
                    and is_complete(problem_stem(root, configuration, index, val, test), configuration, write_xml,
                                    mesh)):
                done += 1
                continue
            if run and (index != run[-1] + 1 or len(run) >= chunk_size):
                chunks.append(Chunk(configuration, run[0], run[-1] + 1))
                run = []
            run.append(index)
        if run:
            chunks.append(Chunk(configuration, run[0], run[-1] + 1))
    return chunks, done


def _npz_names(folder: Path) -> set[str]:
    """The names of the .npz files in ``folder`` (empty if it does not exist)."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name for entry in entries if entry.name.endswith(".npz")}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def write_chunk(job: WriteJob, chunk: Chunk) -> tuple[int, dict[str, bytes]]:
    """Generate and write every problem of ``chunk`` (skipping complete ones); returns the chunk length and
    the content hashes of the problems written, by .npz path relative to ``job.root``."""
    hashes: dict[str, bytes] = {}
    for index in range(chunk.start, chunk.stop):
        stem = problem_stem(job.root, chunk.configuration, index, job.val, job.test)
        if is_complete(stem, chunk.configuration, job.write_xml, job.regime is not None and job.regime.mesh):
            continue
        rng = problem_rng(job.seed, chunk.configuration, index)
        problem = generate_problem(chunk.configuration, rng, mode=job.mode, regime=job.regime,
                                   split=split_of(index, job.val, job.test))
        hashes[f"{chunk.configuration}/{stem.name}.npz"] = write_problem(problem, stem, write_xml=job.write_xml)
    return chunk.stop - chunk.start, hashes


def _worker_init() -> None:
    import cv2

    # Images are tiny: OpenCV's thread pool only adds overhead when several processes already run.
    cv2.setNumThreads(1)


def _run_chunk(args: tuple[WriteJob, Chunk]) -> tuple[int, dict[str, bytes]]:
    return write_chunk(*args)


def _iterate_chunks(job: WriteJob, chunks: list[Chunk], workers: int) -> Iterator[tuple[int, dict[str, bytes]]]:
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield write_chunk(job, chunk)
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(chunks)), initializer=_worker_init) as pool:
        yield from pool.imap_unordered(_run_chunk, [(job, chunk) for chunk in chunks])


def write_dataset(
    root: str | os.PathLike,
    configurations: str | Sequence[str] = "all",
    count: int = 10000,
    seed: int = 1234,
    mode: str = "balanced",
    workers: int = 1,
    write_xml: bool = True,
    start: int = 0,
    progress: bool = True,
    chunk_size: int = 25,
    regime: "Regime | str | None" = None,
    val: int = 2,
    test: int = 2,
) -> dict[str, int]:
    """Generate problems ``start .. start + count - 1`` of each configuration into ``root`` (resumable).

    Problem ``k`` of configuration ``c`` is ``generate_problem(c, problem_rng(seed, c, k), mode, regime,
    split_of(k, val, test))`` written as ``RAVEN_<k>_<split>``, so the bytes written do not depend on
    ``workers`` or on interruptions. ``regime``: a ``regimes.Regime``, a registered name or None (plain
    I-RAVEN); ``val``/``test``: tenths of the indices filed as val / test (``val=0, test=10``: an all-test
    folder). ``workers > 1`` uses a spawn-started process pool over chunks of ``chunk_size`` consecutive
    problems. ``progress``: a bar on stderr while problems are written, drawn only when stderr is a terminal.
    Writes ``generator.json`` and ``regime.json`` into ``root``. Returns
    ``{"total": ..., "skipped": ..., "written": ...}``.

    Raises ``rpm_lib.data.records.GeneratorSettingsError`` when ``root`` holds problems of other settings or
    rendered by another OpenCV.
    """
    if count < 0 or start < 0:
        raise ValueError(f"count and start must be >= 0, got count={count}, start={start}")
    regime = resolve_regime(regime)
    check_mode(mode, regime.mesh)  # before anything is written
    split_of(0, val, test)  # checks the split proportions
    names = resolve_configurations(configurations)
    root = Path(root)
    if is_cache(root):  # problem files inside a cache would change its data fingerprint
        raise DataFormatError(f"{root}: is a training cache (rpm-data prepare or rpm-generate --cache-size), not a "
                              "folder of problem files; choose another --out (or add --cache-size to check the cache)")
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_writer(root / LOCK_FILE, "rpm-generate"):
        return _write_locked(root, names, count, seed, mode, workers, write_xml, start, progress, chunk_size,
                             regime, val, test)


def _check_space_for(root: Path, problems: dict[str, int], mesh: bool, tenths: int) -> None:
    """Refuse (``NotEnoughSpaceError``) to write ``problems[c]`` problems of each configuration ``c`` into
    ``root`` when they cannot fit: each takes its .npz's exact size in bytes times ``tenths / 10`` (room for
    the .xml)."""
    total = sum(problems.values())
    if not total:  # rerunning a finished write (to check it is complete) must work on a full disk too
        return
    # Integers throughout: a typed --num-per-config of 10**400 must not overflow a float.
    needed = sum(n * expected_npz_size(name, mesh) for name, n in problems.items()) * tenths // 10
    check_free_space(root, needed, "rpm-generate", f"{total:,} problems to write, ~{needed // total // 1000:,} kB each")


def _write_locked(root: Path, names: list[str], count: int, seed: int, mode: str, workers: int, write_xml: bool,
                  start: int, progress: bool, chunk_size: int, regime: Regime, val: int,
                  test: int) -> dict[str, int]:
    # .npz sizes are exact (uncompressed); an .xml adds well under 10 % of its .npz, a Mesh .xml (a mask per
    # line) up to ~25 % (94 KB beside 410 KB in the reference files).
    tenths = (13 if regime.mesh else 11) if write_xml else 10
    # First a lower bound that takes one listing per configuration, every .npz present counted as done: the
    # exact scan below visits each requested problem, which for a request that can never fit (10**8 problems
    # per configuration) is many minutes of silence and gigabytes of chunk lists before the same refusal.
    left = {name: max(0, count - len(_npz_names(root / name))) for name in names}
    _check_space_for(root, left, regime.mesh, tenths)
    chunks, done = pending_chunks(root, names, count, start, write_xml, chunk_size, val, test, regime.mesh)
    left = {name: 0 for name in names}
    for chunk in chunks:
        left[chunk.configuration] += chunk.stop - chunk.start
    _check_space_for(root, left, regime.mesh, tenths)
    check_settings(root, seed, mode, regime, val, test)
    check_renderer(root, bool(chunks))
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(root / name)
    total = count * len(names)
    job = WriteJob(str(root), seed, mode, write_xml, regime, val, test)
    bar = None
    if progress and chunks:  # nothing to write: no bar
        from tqdm.auto import tqdm

        # disable=None: a bar on a terminal only; a log file or a SLURM output would get every redraw
        bar = tqdm(total=total, initial=done, unit="problem", desc=f"rpm-generate -> {root}", smoothing=0.05,
                   disable=None)
    written = 0
    hashes: dict[str, bytes] = {}
    try:
        for finished, chunk_hashes in _iterate_chunks(job, chunks, workers):
            written += finished
            hashes.update(chunk_hashes)
            if bar is not None:
                bar.update(finished)
    finally:
        if bar is not None:
            bar.close()
        if hashes:  # an interrupted write keeps the hashes of what it finished
            write_raw_record(root, hashes)
    _record_missing_hashes(root, names, count, start, val, test)
    return {"total": total, "skipped": done, "written": written}


def _record_missing_hashes(root: Path, names: list[str], count: int, start: int, val: int, test: int) -> None:
    """Hash the requested problems the folder's record lacks (written by an interrupted or older write)."""
    try:
        recorded = read_raw_record(root)
    except DataFormatError:  # damaged: rebuilt from the files
        note(f"{root / RAW_RECORD}: damaged; rebuilding it from the problem files")
        (root / RAW_RECORD).unlink()
        recorded = {}
    missing = [path for name in names for index in range(start, start + count)
               for path in [problem_stem(root, name, index, val, test).with_suffix(".npz")]
               if path.relative_to(root).as_posix() not in recorded]
    if missing:
        found, _ = raw_hashes(root, missing, load_raven_npz)
        write_raw_record(root, {path.relative_to(root).as_posix(): value for path, value in zip(missing, found)})
