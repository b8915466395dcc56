"""Reading and validating one raw RAVEN / I-RAVEN or PGM .npz file.

``load_raven_npz`` and ``load_pgm_npz`` are the single place where a raw file's keys, shapes, dtypes and
label consistency are checked; the datasets and the cache builder both call them.

RAVEN-style files come in two label formats (docs/data-formats.md, "Files from raven-datasets"): the
released (8, 9) ``meta_matrix`` and raven-datasets' (12, 9) one, whose rows 8..11 are the I-RAVEN-Mesh
Mesh. A file is a **Mesh problem** when those rows are non-zero; its ``structure`` (when the file has one)
must then name a ``Mesh`` component, and must not otherwise. A (12, 9) file with zero rows 8..11
(Attributeless-I-RAVEN) is a plain problem and is returned with 8 rows, like any I-RAVEN file.
``meta_answer_mods`` (raven-datasets) is never read: it marks the correct answer.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rpm_lib import rules
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.npz import ArrayHeader, read_npz
from rpm_lib.data.records import REGIME_FILE, GeneratorSettingsError, read_regime_file

NUM_PANELS = 16
NUM_CHOICES = 8
RAVEN_KEYS = ("image", "target", "meta_matrix", "meta_target")
#: Read when present, only to cross-check the Mesh: the scene-tree tokens (the Mesh adds ``'Mesh'``).
RAVEN_OPTIONAL_KEYS = ("structure",)
PGM_KEYS = ("image", "target", "relation_structure_encoded", "meta_target")
#: Rows of ``relation_structure_encoded`` in the release (shorter arrays are zero-padded to this).
PGM_MAX_TRIPLES = 4


@dataclass
class RpmRecord:
    """One validated problem.

    Attributes:
        panels: uint8 (16, H, W): 8 context panels (row-major) then 8 choices, in file order; ``None`` when
            loaded with ``with_image=False``.
        target: index 0..7 of the correct choice (file order).
        meta: uint8 ``meta_matrix`` for RAVEN: (8, 9), or (12, 9) for a Mesh problem (rows 8..11: the Mesh);
            ``relation_structure_encoded`` (4, 12) for PGM.
        meta_target: uint8 (9,) RAVEN / (12,) PGM, the dense label (for a Mesh problem the OR includes the
            Mesh's rows, as in the file).
    """

    panels: np.ndarray | None
    target: int
    meta: np.ndarray
    meta_target: np.ndarray

    @property
    def mesh(self) -> bool:
        """True for an I-RAVEN-Mesh problem (a RAVEN ``meta`` with 12 rows)."""
        return self.meta.shape[0] == rules.MESH_META_ROWS and self.meta.shape[1] == len(rules.META_TARGET_FORMAT)


def _check_shape(path: Path, key: str, array: np.ndarray | ArrayHeader, shape: tuple[int, ...]) -> None:
    if tuple(array.shape) != shape:
        raise DataFormatError(f"{path}: {key!r} has shape {tuple(array.shape)}, expected {shape}")


def _check_kind(path: Path, key: str, array: np.ndarray | ArrayHeader, kinds: str, expected: str) -> None:
    if array.dtype.kind not in kinds:
        raise DataFormatError(f"{path}: {key!r} has dtype {array.dtype}, expected {expected}")


def _target(path: Path, array: np.ndarray) -> int:
    if array.size != 1:
        raise DataFormatError(f"{path}: 'target' has shape {array.shape}, expected a scalar")
    _check_kind(path, "target", array, "iu", "an integer type")
    value = int(array.reshape(()))
    if not 0 <= value < NUM_CHOICES:
        raise DataFormatError(f"{path}: 'target' = {value} is out of range 0..{NUM_CHOICES - 1}")
    return value


def _binary(path: Path, key: str, array: np.ndarray, shape: tuple[int, ...], kinds: str = "biu") -> np.ndarray:
    _check_shape(path, key, array, shape)
    _check_kind(path, key, array, kinds, "0/1 integers")
    if not ((array == 0) | (array == 1)).all():
        raise DataFormatError(f"{path}: {key!r} must hold only 0/1, got values {np.unique(array).tolist()}")
    return array.astype(np.uint8)


def _structure_has_mesh(path: Path, structure: np.ndarray) -> bool:
    """Whether the ``structure`` tokens (bytes or str, 1-D) name a Mesh component."""
    if structure.ndim != 1 or structure.dtype.kind not in "SU":
        raise DataFormatError(f"{path}: 'structure' has shape {structure.shape} and dtype {structure.dtype}, "
                              "expected a 1-D array of strings")
    tokens = [t.decode("ascii", "replace") if isinstance(t, bytes) else str(t) for t in structure.tolist()]
    return rules.MESH_NAME in tokens


def load_raven_npz(path: str | Path, with_image: bool = True) -> RpmRecord:
    """Read and validate one RAVEN / I-RAVEN / Attributeless-I-RAVEN / I-RAVEN-Mesh file ``RAVEN_<k>_<split>.npz``.

    Checks: the file opens; keys ``image``, ``target``, ``meta_matrix``, ``meta_target`` exist; ``image`` is
    uint8 (16, H, H); ``target`` is an integer in 0..7; ``meta_matrix`` is 0/1 (8, 9) or (12, 9) and describes
    a valid rule set (``rules.raven_rules_from_meta_matrix``: a Mesh's Type/Size/Color rules are Constant);
    ``meta_target`` is 0/1 (9,) and equals the OR of all rows of ``meta_matrix``; when the file has a
    ``structure``, it names a ``Mesh`` component exactly when rows 8..11 are non-zero. Nothing else is read
    (in particular not ``meta_answer_mods``, which gives the answer away).

    Returns:
        ``meta`` (12, 9) for a Mesh problem, else (8, 9) (zero rows 8..11 dropped).

    Args:
        path: the .npz file.
        with_image: False reads only the image header (shape/dtype are still checked), for label tables.

    Raises:
        DataFormatError: naming the file and the problem.
    """
    path = Path(path)
    arrays = read_npz(path, RAVEN_KEYS, header_only=() if with_image else ("image",), optional=RAVEN_OPTIONAL_KEYS)
    return raven_record(path, arrays, with_image)


def raven_record(path: str | Path, arrays: Mapping[str, Any], with_image: bool = True) -> RpmRecord:
    """Validate the arrays of one RAVEN-layout problem (what :func:`load_raven_npz` checks, see there).

    The one definition of a valid RAVEN problem: files go through it after reading, and problems that
    ``rpm-generate --cache-size`` puts straight into a cache go through it without ever being a file.

    Args:
        path: the file, or the name the problem would have as a file (``<configuration>/RAVEN_<k>_<split>.npz``);
            only used in messages.
        arrays: ``image`` (array, or only its header when ``with_image`` is False), ``target``, ``meta_matrix``,
            ``meta_target`` and optionally ``structure``.

    Raises:
        DataFormatError: naming ``path`` and the problem.
    """
    image = arrays["image"]
    if len(image.shape) != 3 or image.shape[0] != NUM_PANELS or image.shape[1] != image.shape[2] or image.shape[1] < 1:
        raise DataFormatError(f"{path}: 'image' has shape {tuple(image.shape)}, expected (16, H, H) e.g. (16, 160, 160)")
    _check_kind(path, "image", image, "u", "uint8")
    if image.dtype != np.uint8:
        raise DataFormatError(f"{path}: 'image' has dtype {image.dtype}, expected uint8")
    target = _target(path, arrays["target"])
    width = len(rules.META_TARGET_FORMAT)
    rows = arrays["meta_matrix"].shape[0] if arrays["meta_matrix"].ndim == 2 else -1
    if rows not in (rules.META_ROWS, rules.MESH_META_ROWS) or arrays["meta_matrix"].shape[1] != width:
        raise DataFormatError(f"{path}: 'meta_matrix' has shape {tuple(arrays['meta_matrix'].shape)}, expected "
                              f"({rules.META_ROWS}, {width}) or ({rules.MESH_META_ROWS}, {width}) (with a Mesh)")
    meta = _binary(path, "meta_matrix", arrays["meta_matrix"], (rows, width))
    try:
        rules.raven_rules_from_meta_matrix(meta)
    except ValueError as error:
        raise DataFormatError(f"{path}: invalid rules: {error}") from None
    meta_target = _binary(path, "meta_target", arrays["meta_target"], (width,))
    if not np.array_equal(meta_target, meta.max(axis=0)):
        raise DataFormatError(
            f"{path}: 'meta_target' {meta_target.tolist()} is not the OR of the rows of 'meta_matrix' "
            f"{meta.max(axis=0).tolist()}"
        )
    mesh = bool(meta[rules.META_ROWS :].any())
    if "structure" in arrays and _structure_has_mesh(path, arrays["structure"]) != mesh:
        raise DataFormatError(
            f"{path}: 'structure' names a Mesh component but 'meta_matrix' has no Mesh rules (rows 8-11 missing "
            "or zero)" if not mesh else
            f"{path}: 'meta_matrix' rows 8-11 hold Mesh rules but 'structure' names no Mesh component"
        )
    if not mesh:
        meta = np.ascontiguousarray(meta[: rules.META_ROWS])
    panels = np.ascontiguousarray(image) if with_image else None
    return RpmRecord(panels, target, meta, meta_target)


def stack_raven_meta(metas: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """The label table of many RAVEN problems: uint8 (N, 12, 9) when one of them is a Mesh problem (the
    others get zero rows 8..11, raven-datasets' "no Mesh"), else (N, 8, 9).

    Args:
        metas: (8, 9) / (12, 9) matrices, or an (N, 8 | 12, 9) array (e.g. rows of a cache, which keeps 12 rows
            when any problem of the whole cache has a Mesh: trimmed here when the selected ones have none).
    """
    width = len(rules.META_TARGET_FORMAT)
    if isinstance(metas, np.ndarray) and metas.ndim == 3:
        has_mesh = metas.shape[1] == rules.MESH_META_ROWS and bool(metas[:, rules.META_ROWS :].any())
        return metas if has_mesh else np.ascontiguousarray(metas[:, : rules.META_ROWS])
    rows = rules.MESH_META_ROWS if any(m.shape[0] == rules.MESH_META_ROWS and m[rules.META_ROWS :].any()
                                       for m in metas) else rules.META_ROWS
    out = np.zeros((len(metas), rows, width), dtype=np.uint8)
    for i, m in enumerate(metas):
        out[i, : min(rows, m.shape[0])] = m[:rows]
    return out


def _pgm_panels(path: Path, image: np.ndarray | ArrayHeader) -> np.ndarray | None:
    """(16, H, H) uint8 from the stored buffer; None for a header. Reshape, never transpose."""
    shape = tuple(image.shape)
    if not (
        len(shape) == 3
        and ((shape[2] == NUM_PANELS and shape[0] == shape[1]) or (shape[0] == NUM_PANELS and shape[1] == shape[2]))
    ):
        raise DataFormatError(f"{path}: 'image' has shape {shape}, expected (160, 160, 16) (or (16, 160, 160))")
    _check_kind(path, "image", image, "uif", "a numeric type")
    if isinstance(image, ArrayHeader):
        return None
    side = shape[1] if shape[0] == NUM_PANELS else shape[0]
    # The release stores the 16 panels one after another in memory although the declared shape is
    # (H, W, 16): a reshape recovers the panels, a transpose would interleave them.
    panels = np.ascontiguousarray(image).reshape(NUM_PANELS, side, side)
    if panels.dtype != np.uint8:
        if panels.dtype.kind == "f":
            if not np.isfinite(panels).all():
                raise DataFormatError(f"{path}: 'image' contains NaN or infinite values")
            panels = np.rint(panels)
        low, high = panels.min(), panels.max()
        if low < 0 or high > 255:
            raise DataFormatError(f"{path}: 'image' values span [{low}, {high}], expected 0..255")
        panels = panels.astype(np.uint8)
    return panels


def load_pgm_npz(path: str | Path, with_image: bool = True) -> RpmRecord:
    """Read and validate one PGM file ``PGM_<regime>_<split>_<id>.npz``.

    Checks: keys ``image``, ``target``, ``relation_structure_encoded``, ``meta_target``; ``image`` numeric
    with 16 panels of H x H pixels stored as (H, H, 16) (reshaped, not transposed, to (16, H, H)) with values
    in 0..255 (cast to uint8); ``target`` integer 0..7; ``relation_structure_encoded`` 0/1 (n, 12), n <= 4,
    every non-zero row one (object, attribute, relation) triple (zero-padded to (4, 12));
    ``meta_target`` 0/1 (12,) (cast to uint8; taken as stored).

    Raises:
        DataFormatError: naming the file and the problem.
    """
    path = Path(path)
    arrays = read_npz(path, PGM_KEYS, header_only=() if with_image else ("image",))
    panels = _pgm_panels(path, arrays["image"])
    target = _target(path, arrays["target"])
    structure = arrays["relation_structure_encoded"]
    width = len(rules.PGM_META_TARGET_FORMAT)
    if structure.ndim != 2 or structure.shape[1] != width or not 1 <= structure.shape[0] <= PGM_MAX_TRIPLES:
        raise DataFormatError(
            f"{path}: 'relation_structure_encoded' has shape {structure.shape}, expected (4, 12)"
        )
    structure = _binary(path, "relation_structure_encoded", structure, structure.shape, kinds="biuf")
    try:
        rules.pgm_triples(structure)
    except ValueError as error:
        raise DataFormatError(f"{path}: invalid rules: {error}") from None
    meta = np.zeros((PGM_MAX_TRIPLES, width), dtype=np.uint8)
    meta[: len(structure)] = structure
    meta_target = _binary(path, "meta_target", arrays["meta_target"], (width,), kinds="biuf")
    return RpmRecord(panels, target, meta, meta_target)


def read_regime_record(root: str | Path) -> dict | None:
    """The checked content of ``root``'s ``regime.json``, or None when it has none.

    The record must be a JSON object that agrees with ``generator.json`` (``rpm_lib.data.records.read_regime_file``)
    and with the data: a Mesh regime's problems have 12-row ``meta_matrix`` labels, every other regime's 8 rows
    (checked on the first problem file).

    Raises:
        GeneratorSettingsError: one line naming the file and the disagreement.
    """
    data = read_regime_file(root)
    if data is None:
        return None
    root = Path(root)
    mesh = data.get("mesh")
    first = next(iter(sorted(root.glob("*/RAVEN_*_*.npz"))), None)
    if first is not None and isinstance(mesh, bool):  # a mesh flag of another type is refused with the regime
        try:
            rows = load_raven_npz(first, with_image=False).meta.shape[0]
        except DataFormatError:
            rows = None  # the dataset reports a damaged file with its own message
        wanted = rules.MESH_META_ROWS if mesh else rules.META_ROWS
        if rows is not None and rows != wanted:
            raise GeneratorSettingsError(f"{root / REGIME_FILE}: says mesh={mesh}, but {first} has {rows}-row "
                                         f"meta_matrix labels ({wanted} for that regime); the record does not "
                                         "describe this data")
    return data
