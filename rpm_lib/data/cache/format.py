"""The layout of a training cache: its files, dataset kinds and manifest, and the check of a finished cache.

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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rpm_lib import rules
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.problem_hashes import CACHE_ARRAY, HASH_BYTES, METHOD as HASH_METHOD
from rpm_lib.data.raw_files import SPLITS, pgm_source_id, raven_source_id
from rpm_lib.data.records import MANIFEST
from rpm_lib.data.validation import NUM_PANELS, PGM_MAX_TRIPLES, RpmRecord, load_pgm_npz, load_raven_npz
from rpm_lib.json_files import read_object, shown_value


CACHE_FORMAT = "rpm_lib-cache"
CACHE_VERSION = 1
JOURNAL = "journal.jsonl"
PLAN = "plan.json"
SKIPPED = "skipped.txt"
ON_ERROR = ("stop", "skip")


@dataclass(frozen=True)
class Kind:
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
KINDS: dict[str, Kind] = {
    "raven": Kind("raven", rules.CONFIGURATIONS, (rules.META_ROWS, _RAVEN_WIDTH), _RAVEN_WIDTH, load_raven_npz,
                   raven_source_id, (rules.MESH_META_ROWS, _RAVEN_WIDTH)),
    "pgm": Kind("pgm", rules.PGM_REGIMES, _PGM_META, len(rules.PGM_META_TARGET_FORMAT), load_pgm_npz, pgm_source_id,
                 _PGM_META),
}


def kind_spec(kind: str) -> Kind:
    """The :data:`KINDS` entry of ``kind`` (``"raven"`` / ``"pgm"``); ``ValueError`` (one line) for another."""
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; expected one of {list(KINDS)}") from None


def is_cache(path: str | Path) -> bool:
    """True when ``path`` is a complete cache (has a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: str | Path) -> dict:
    """The manifest of the complete cache ``path``; ``DataFormatError`` (one line) when there is none, or it is
    not a JSON object of this cache format and version."""
    path = Path(path)
    try:
        manifest = read_object(path / MANIFEST, DataFormatError)
    except FileNotFoundError:
        raise DataFormatError(f"{path}: not a complete rpm_lib cache (no {MANIFEST})") from None
    except OSError as error:
        raise DataFormatError(f"{path / MANIFEST}: unreadable manifest ({error.strerror or type(error).__name__})") \
            from None
    if manifest.get("format") != CACHE_FORMAT or type(manifest.get("version")) is not int \
            or manifest["version"] != CACHE_VERSION:  # JSON's true equals 1 in Python
        raise DataFormatError(
            f"{path / MANIFEST}: not an rpm_lib cache of version {CACHE_VERSION} "
            f"(format={shown_value(manifest.get('format'), 40)}, version={shown_value(manifest.get('version'), 40)})"
        )
    # The fields readers use before check_cache (CacheReader compares kind, size and resize, then names the plan's
    # source): of their type when present; a missing one is named by whoever needs it.
    _check_field_types(manifest, path / MANIFEST, missing_ok=True)
    return manifest


#: The arrays of a build that ``build._allocate`` writes whole from the file list (the rest are filled chunk by
#: chunk).
INDEX_ARRAYS = ("groups.npy", "splits.npy", "file_ids.npy")


def build_layout(n: int, size: int, spec: Kind) -> dict[str, tuple[type, tuple[int, ...]]]:
    """Every array of a build of ``n`` rows at ``size`` px, as file name -> (dtype, shape): what ``build._allocate``
    makes and what an interrupted build must still hold to be continued (``partial.partial_damage``)."""
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


#: What ``manifest.json`` must hold for a reader: field -> (type, description for the error).
_MANIFEST_FIELDS: dict[str, tuple[type, str]] = {
    "kind": (str, "a dataset kind"), "image_size": (int, "a panel size in px"), "resize": (str, "a resize method"),
    "num_rows": (int, "a row count"), "group_names": (list, "a list of names"), "plan": (dict, "the build plan"),
}


def _check_field_types(manifest: dict, where: Path, missing_ok: bool) -> None:
    """Refuse a field of :data:`_MANIFEST_FIELDS` of another type (a missing one too, unless ``missing_ok``)."""
    for field, (kind, description) in _MANIFEST_FIELDS.items():
        if missing_ok and field not in manifest:
            continue
        value = manifest.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataFormatError(f"{where}: field {field!r} must be {description} ({kind.__name__}), got "
                                  f"{shown_value(value)}")


def array_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
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
    _check_field_types(manifest, where, missing_ok=False)
    if manifest["kind"] not in KINDS:
        raise DataFormatError(f"{where}: field 'kind' must be one of {list(KINDS)}, got "
                              f"{shown_value(manifest['kind'])}")
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
                              f"cache, got {shown_value(meta_rows)}")
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
            raise DataFormatError(f"{where}: field 'problem_hashes' must be {HASH_METHOD!r}, got {shown_value(method)}")
        expected["problem_hashes"] = (np.uint8, (n, HASH_BYTES))
    if not isinstance(manifest.get("regime"), (dict, type(None))):
        raise DataFormatError(f"{where}: field 'regime' must be the regime.json object or null, got "
                              f"{shown_value(manifest['regime'])}")
    # A cache made by rpm-generate --cache-size has no raw folder to prepare again: name the command that made it.
    rebuild = "rpm-generate --cache-size" if isinstance(manifest["plan"].get("generator"), dict) else "rpm-data prepare"
    for name, (dtype, shape) in expected.items():
        file = path / f"{name}.npy"
        if not file.is_file():
            raise DataFormatError(f"{file}: missing (the cache is incomplete; delete it and rebuild it with "
                                  f"`{rebuild}`)")
        try:
            found_shape, found_dtype, offset = array_header(file)
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
