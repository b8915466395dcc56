"""Writing generated problems to disk in the released RAVEN / I-RAVEN layout (docs/data-formats.md).

``<root>/<configuration>/RAVEN_<k>_<split>.npz`` (+ ``.xml``), split by ``k % 10`` in tenths
(``regimes.split_of``; ``val``/``test`` default 2/2: 0-5 train, 6-7 val, 8-9 test). The .npz holds
``target, predict, image, meta_matrix, meta_structure, meta_target, structure`` (the reference's key order)
in ``np.savez``'s uncompressed format. Two deliberate differences from ``np.savez``: the zip entries carry
a fixed timestamp (1980-01-01) so that equal problems give byte-identical files, and ``predict`` is
``target`` (the reference generators' heuristic solver chose the target in all 2,240 problems checked, so
the solver is not re-implemented; docs/generator.md, "Deliberate differences from the reference
generators").

Crash safety and resuming: each file is written to a hidden temporary name in the same folder and
moved into place with ``os.replace`` - the .npz first, the .xml last - so a file under its final name
is always complete and "the .xml exists" means the problem is finished. A problem is considered done
when its .npz has exactly the expected size and (unless ``write_xml=False``) its .xml ends with
``</Data>``; everything else is regenerated (deterministically, to the same bytes).

Regimes (docs/generator.md, "Generalisation regimes"): ``write_dataset(..., regime=, val=, test=)`` gives each
problem the split it is filed under, so a held-out group follows the train rule in ``_train``/``_val`` files
and another rule in ``_test`` files. The file format stays I-RAVEN's (8-row ``meta_matrix``) for every
Attributeless regime -- a deliberate difference from raven-datasets, whose files always have 12 rows. The
regime is recorded in ``regime.json`` (:data:`REGIME_FILE`) and, with seed, mode and split proportions, in
``generator.json`` (:data:`SETTINGS_FILE`), which refuses a resumed write with other settings.

I-RAVEN-Mesh (``regime.mesh``; docs/generator.md, "Mesh") uses raven-datasets' label layout: ``meta_matrix``
(12, 9) with the Mesh's rules in rows 8..11, ``structure`` with the Mesh tokens (``labels``); still no
``meta_answer_mods`` (it marks the answer). Its .npz sizes are fixed too (``expected_npz_size(c, mesh=True)``).
"""
from __future__ import annotations

import io
import json
import os
import struct
import sys
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.data.cache import is_cache
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import (RAW_RECORD, note, panels_hash, raw_hashes, read_raw_record,
                                         write_raw_record)
from rpm_lib.folder_lock import check_free_space, exclusive_writer
from rpm_lib.json_files import read_object
from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.candidates import check_mode
from rpm_lib.generator.labels import problem_labels, structure
from rpm_lib.generator.problem import Problem
from rpm_lib.generator.regimes import Regime, resolve_regime, split_of
from rpm_lib.generator.render import render_problem
from rpm_lib.generator.xml_io import problem_xml
from rpm_lib.rules import MESH_META_ROWS, META_ROWS, resolve_configurations

_TEMP_PREFIX = ".RAVEN_"
_TEMP_SUFFIX = ".tmp"


# ``split_of(index, val=2, test=2)`` is defined in ``regimes`` (the generator needs it too) and re-exported here.


def problem_stem(root: str | os.PathLike, configuration: str, index: int, val: int = 2, test: int = 2) -> Path:
    """``<root>/<configuration>/RAVEN_<index>_<split>`` (add ``.npz`` / ``.xml``); split ``split_of(index, val,
    test)``."""
    return Path(root) / configuration / f"RAVEN_{index}_{split_of(index, val, test)}"


# ---------------------------------------------------------------------------------------------------
# .npz
# ---------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header (format 1.0, as ``np.save`` writes it) of a C-ordered array of ``descr`` and ``shape``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


# A stored (uncompressed) zip, written by hand: zipfile + np.lib.format.write_array cost ~0.7 ms per
# problem in copies; this streams the arrays' buffers straight to the file.
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_CENTRAL_HEADER = struct.Struct("<IHHHHHHIIIHHHHHII")
_END_RECORD = struct.Struct("<IHHHHIIH")
_DOS_TIME, _DOS_DATE = 0, (1 << 5) | 1  # 1980-01-01 00:00:00
_ZIP_VERSION = 20
_MADE_BY_UNIX = (3 << 8) | _ZIP_VERSION
_FILE_MODE = 0o644 << 16


def write_npz(arrays: dict[str, np.ndarray], file) -> None:
    """Write ``arrays`` to the binary file object ``file`` as an uncompressed .npz (``np.load`` reads it).

    Deterministic: same arrays -> same bytes (the zip timestamps are fixed to 1980-01-01).
    """
    central: list[bytes] = []
    offset = 0
    for name, array in arrays.items():
        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        if array.dtype.hasobject:
            raise ValueError(f"array {name!r} has dtype object; .npz files here never use pickles")
        header = _npy_header(np.lib.format.dtype_to_descr(array.dtype), array.shape)
        payload = memoryview(array).cast("B") if array.ndim else array.tobytes()
        size = len(header) + len(payload)
        if size >= 2**32:
            raise ValueError(f"array {name!r} is too large for a zip32 entry")
        crc = zlib.crc32(payload, zlib.crc32(header))
        filename = (name + ".npy").encode("ascii")
        file.write(_LOCAL_HEADER.pack(0x04034B50, _ZIP_VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size,
                                      len(filename), 0))
        file.write(filename)
        file.write(header)
        file.write(payload)
        central.append(_CENTRAL_HEADER.pack(0x02014B50, _MADE_BY_UNIX, _ZIP_VERSION, 0, 0, _DOS_TIME, _DOS_DATE,
                                            crc, size, size, len(filename), 0, 0, 0, 0, _FILE_MODE, offset)
                       + filename)
        offset += _LOCAL_HEADER.size + len(filename) + size
    directory = b"".join(central)
    file.write(directory)
    file.write(_END_RECORD.pack(0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0))


def npz_arrays(problem: Problem, image: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The .npz arrays of ``problem`` in file order.

    ``image``: uint8 (16, 160, 160); if None, ``problem.extra["image"]`` (set by
    ``generate_problems(render=True)``) or else a fresh ``render_problem(problem)``.
    """
    if image is None:
        image = problem.extra.get("image")
    if image is None:
        image = render_problem(problem)
    if image.shape != (16, 160, 160) or image.dtype != np.uint8:
        raise ValueError(f"image must be uint8 (16, 160, 160), got {image.dtype} {image.shape}")
    labels = problem_labels(problem)
    target = np.array(problem.target, np.int64)
    return {
        "target": target,
        "predict": target.copy(),
        "image": image,
        "meta_matrix": labels["meta_matrix"],
        "meta_structure": labels["meta_structure"],
        "meta_target": labels["meta_target"],
        "structure": labels["structure"],
    }


@lru_cache(maxsize=None)
def expected_npz_size(configuration: str, mesh: bool = False) -> int:
    """Exact byte size of every .npz this module writes for ``configuration`` (fixed shapes and dtypes), with
    or without the Mesh."""
    buffer = io.BytesIO()
    rows = MESH_META_ROWS if mesh else META_ROWS
    arrays = {
        "target": np.array(0, np.int64),
        "predict": np.array(0, np.int64),
        "image": np.zeros((16, 160, 160), np.uint8),
        "meta_matrix": np.zeros((rows, 9), np.uint8),
        "meta_structure": np.zeros(21, np.uint8),
        "meta_target": np.zeros(9, np.uint8),
        "structure": structure(configuration, mesh),
    }
    write_npz(arrays, buffer)
    return len(buffer.getvalue())


# ---------------------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------------------


def _atomic_write(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    # Hidden, same folder (so os.replace is an atomic rename), never matching a loader's "*.npz" glob.
    temp = path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            write(handle)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


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
    _atomic_write(stem.with_name(stem.name + ".npz"), lambda handle: write_npz(arrays, handle))
    if xml is not None:
        _atomic_write(stem.with_name(stem.name + ".xml"), lambda handle: handle.write(xml))
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
        for path in folder.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"):
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
    problems. Writes ``generator.json`` and ``regime.json`` into ``root``. Returns
    ``{"total": ..., "skipped": ..., "written": ...}``.
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


#: Written into a generated folder: the settings its problems were made with (seed, mode, regime, split
#: proportions, generator version).
SETTINGS_FILE = "generator.json"
#: Written into a generated folder: its regime, for people and loaders (``regime_record`` gives the content).
REGIME_FILE = "regime.json"
#: The write lock of a generated folder (see rpm_lib.folder_lock).
LOCK_FILE = ".rpm-generate.lock"

#: generator.json's record of how a balanced Mesh folder draws its distractors' Mesh line counts
#: (``rpm_lib.generator.mesh_balance``); Mesh folders made before it have raven-datasets' uniform draw.
MESH_DRAW_KEY = "mesh_number_draw"
MESH_DRAW = "answer-blind-v1"

# What a settings record written before regimes existed means for the keys it lacks: such a generator could
# only write plain I-RAVEN with the 6/2/2 split.
_SETTINGS_BEFORE_REGIMES = {"regime": "I-RAVEN", "held_out": {}, "mesh": False, "val": 2, "test": 2}


def regime_record(regime: Regime, seed: int, mode: str, val: int, test: int) -> dict:
    """The content of ``regime.json``: regime name, one-line description, held-out groups by name with their
    train rules (``{"Color": "Constant"}``), mesh flag, seed, candidate mode, val / test tenths, generator
    and version."""
    import rpm_lib

    return {**regime.to_json(), "seed": int(seed), "mode": mode, "val": val, "test": test,
            "train": 10 - val - test, "generator": "rpm_lib", "version": rpm_lib.__version__}


def _write_regime_file(root: Path, regime: Regime, seed: int, mode: str, val: int, test: int) -> None:
    _atomic_write(root / REGIME_FILE, lambda handle: handle.write(
        (json.dumps(regime_record(regime, seed, mode, val, test), indent=1) + "\n").encode()))


def generator_settings(seed: int, mode: str, regime: Regime, val: int, test: int) -> dict:
    """What decides a generated folder's problems besides their indices (``generator.json`` without the version):
    seed, candidate mode, regime name, held-out groups, mesh flag, val / test tenths, and for a balanced Mesh the
    line-count draw. Problems of two folders with equal settings are byte-identical index by index."""
    wanted = {"seed": int(seed), "mode": mode, "regime": regime.name, "held_out": regime.to_json()["held_out"],
              "mesh": regime.mesh, "val": val, "test": test}
    if regime.mesh and mode == "balanced":
        # The balanced Mesh draws its distractors' line counts answer-blind since this key exists; a Mesh folder
        # without it holds raven-datasets' draws, and extending it would mix the two.
        wanted[MESH_DRAW_KEY] = MESH_DRAW
    return wanted


def _check_settings(root: Path, seed: int, mode: str, regime: Regime | None = None, val: int = 2,
                    test: int = 2) -> None:
    """Refuse to add problems of other settings to a folder; record the settings (and ``regime.json``) in a new one."""
    import rpm_lib

    regime = resolve_regime(regime)
    record = root / SETTINGS_FILE
    wanted = generator_settings(seed, mode, regime, val, test)
    if record.is_file():
        found = _read_settings(record)
        differ = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
        if differ:
            said = ", ".join(f"{k} {old!r} there, {new!r} asked" for k, (old, new) in differ.items())
            raise GeneratorSettingsError(f"{root}: holds problems generated with other settings ({said}); use the "
                                         "same settings to extend it, or another --out")
        if not (root / REGIME_FILE).is_file():  # a folder of an rpm_lib from before regime.json
            _write_regime_file(root, regime, seed, mode, val, test)
        elif _regime_fields(root / REGIME_FILE) != _regime_fields(None, regime_record(regime, seed, mode, val, test)):
            # generator.json (just checked) says what the problems are; a truncated or edited regime.json must not
            # outlive the resume that could repair it.
            print(f"rpm-generate: note: {root / REGIME_FILE} did not match {SETTINGS_FILE}; rewritten from the "
                  "settings", file=sys.stderr)
            _write_regime_file(root, regime, seed, mode, val, test)
        return
    if any(root.glob("*/RAVEN_*_*.npz")):
        print(f"rpm-generate: note: {root} has problems but no {SETTINGS_FILE} (made by an older rpm_lib); their "
              f"seed and mode cannot be checked, and no {REGIME_FILE} is written", file=sys.stderr)
        return
    _write_regime_file(root, regime, seed, mode, val, test)
    record.write_text(json.dumps({**wanted, "generator": "rpm_lib", "version": rpm_lib.__version__,
                                  opencv_version.KEY: opencv_version.current()}, indent=1) + "\n")


def _check_renderer(root: Path, writing: bool) -> None:
    """Refuse to add problems to a folder whose ``generator.json`` says another OpenCV rendered it: the two draw
    some pixels differently (``rpm_lib.data.opencv_version``), and one folder must not mix them. A finished folder
    (nothing to write) is only read, and a folder from before the record says nothing either way."""
    there, here = opencv_version.rendered_by(root), opencv_version.current()
    if writing and there is not None and there != here:
        raise GeneratorSettingsError(f"{root}: its problems were rendered with OpenCV {there}, and this OpenCV "
                                     f"({here}) draws some pixels differently; finish it with OpenCV {there}, or use "
                                     "another --out")


def _read_settings(path: Path) -> dict:
    """``generator.json``'s settings, with what a record written by an earlier rpm_lib means for the keys it
    lacks (before regimes: plain I-RAVEN 6/2/2; a Mesh folder before the answer-blind draw: raven-datasets' draw).

    Raises:
        GeneratorSettingsError: not a JSON object (one line naming the file).
    """
    found = {**_SETTINGS_BEFORE_REGIMES, **read_object(path, GeneratorSettingsError)}
    if found.get("mesh") and MESH_DRAW_KEY not in found:
        found[MESH_DRAW_KEY] = "raven-datasets (made before the answer-blind draw)"
    return found


#: The fields ``regime.json`` and ``generator.json`` both record, which must agree.
_SHARED_FIELDS = ("regime", "held_out", "mesh", "seed", "mode", "val", "test")


def _regime_fields(path: Path | None, data: dict | None = None) -> dict | None:
    """The shared fields of a regime record (read from ``path`` unless ``data`` is given); None when unreadable."""
    if data is None:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
    if not isinstance(data, dict):
        return None
    return {key: data.get(key) for key in _SHARED_FIELDS}


def read_regime_record(root: str | os.PathLike) -> dict | None:
    """The checked content of ``root``'s ``regime.json`` (:func:`regime_record`), or None when it has none.

    The record must be a JSON object naming a valid regime, agree with ``generator.json`` (when present) on
    regime, held-out groups, mesh, seed, mode and split proportions, and with the data: a Mesh regime's problems
    have 12-row ``meta_matrix`` labels, every other regime's 8 rows (checked on the first problem file).

    Raises:
        GeneratorSettingsError: one line naming the file and the disagreement.
    """
    root = Path(root)
    path = root / REGIME_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GeneratorSettingsError(f"{path} is not readable JSON ({error})") from None
    try:
        regime = Regime.from_json(data)
    except ValueError as error:
        raise GeneratorSettingsError(f"{path}: {error}") from None
    settings = root / SETTINGS_FILE
    if settings.is_file():
        found = _read_settings(settings)
        differ = [f"{key} {data.get(key)!r} vs {found.get(key)!r}" for key in _SHARED_FIELDS
                  if data.get(key) != found.get(key)]
        if differ:
            raise GeneratorSettingsError(f"{path}: disagrees with {settings} ({'; '.join(differ)}); one of them was "
                                         "edited or replaced: regenerate the folder")
    first = next(iter(sorted(root.glob("*/RAVEN_*_*.npz"))), None)
    if first is not None:
        from rpm_lib.data.validation import load_raven_npz

        try:
            rows = load_raven_npz(first, with_image=False).meta.shape[0]
        except DataFormatError:
            rows = None  # the dataset reports a damaged file with its own message
        wanted = MESH_META_ROWS if regime.mesh else META_ROWS
        if rows is not None and rows != wanted:
            raise GeneratorSettingsError(f"{path}: says mesh={regime.mesh}, but {first} has {rows}-row meta_matrix "
                                         f"labels ({wanted} for that regime); the record does not describe this data")
    return data


class GeneratorSettingsError(RuntimeError):
    """The output folder holds problems of another seed, mode, regime or split (or an unreadable settings record)."""


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
    _check_settings(root, seed, mode, regime, val, test)
    _check_renderer(root, bool(chunks))
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(root / name)
    total = count * len(names)
    job = WriteJob(str(root), seed, mode, write_xml, regime, val, test)
    bar = None
    if progress and chunks:  # nothing to write: no bar
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=done, unit="problem", desc=f"rpm-generate -> {root}", smoothing=0.05)
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
        from rpm_lib.data.validation import load_raven_npz

        found, _ = raw_hashes(root, missing, load_raven_npz)
        write_raw_record(root, {path.relative_to(root).as_posix(): value for path, value in zip(missing, found)})
