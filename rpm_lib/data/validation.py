"""Reading and validating one raw RAVEN / I-RAVEN or PGM .npz file.

``load_raven_npz`` and ``load_pgm_npz`` are the single place where a raw file's keys, shapes, dtypes and
label consistency are checked; the datasets and the cache builder both call them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rpm_lib import rules
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.npz import ArrayHeader, read_npz

NUM_PANELS = 16
NUM_CHOICES = 8
RAVEN_KEYS = ("image", "target", "meta_matrix", "meta_target")
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
        meta: uint8 ``meta_matrix`` (8, 9) for RAVEN, ``relation_structure_encoded`` (4, 12) for PGM.
        meta_target: uint8 (9,) RAVEN / (12,) PGM, the dense label.
    """

    panels: np.ndarray | None
    target: int
    meta: np.ndarray
    meta_target: np.ndarray


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


def load_raven_npz(path: str | Path, with_image: bool = True) -> RpmRecord:
    """Read and validate one RAVEN / I-RAVEN file ``RAVEN_<k>_<split>.npz``.

    Checks: the file opens; keys ``image``, ``target``, ``meta_matrix``, ``meta_target`` exist; ``image`` is
    uint8 (16, H, H); ``target`` is an integer in 0..7; ``meta_matrix`` is 0/1 (8, 9) and describes a valid
    rule set (``rules.raven_rules_from_meta_matrix``); ``meta_target`` is 0/1 (9,) and equals the OR of the
    rows of ``meta_matrix``.

    Args:
        path: the .npz file.
        with_image: False reads only the image header (shape/dtype are still checked), for label tables.

    Raises:
        DataFormatError: naming the file and the problem.
    """
    path = Path(path)
    arrays = read_npz(path, RAVEN_KEYS, header_only=() if with_image else ("image",))
    image = arrays["image"]
    if len(image.shape) != 3 or image.shape[0] != NUM_PANELS or image.shape[1] != image.shape[2] or image.shape[1] < 1:
        raise DataFormatError(f"{path}: 'image' has shape {tuple(image.shape)}, expected (16, H, H) e.g. (16, 160, 160)")
    _check_kind(path, "image", image, "u", "uint8")
    if image.dtype != np.uint8:
        raise DataFormatError(f"{path}: 'image' has dtype {image.dtype}, expected uint8")
    target = _target(path, arrays["target"])
    meta = _binary(path, "meta_matrix", arrays["meta_matrix"], (8, len(rules.META_TARGET_FORMAT)))
    try:
        rules.raven_rules_from_meta_matrix(meta)
    except ValueError as error:
        raise DataFormatError(f"{path}: invalid rules: {error}") from None
    meta_target = _binary(path, "meta_target", arrays["meta_target"], (len(rules.META_TARGET_FORMAT),))
    if not np.array_equal(meta_target, meta.max(axis=0)):
        raise DataFormatError(
            f"{path}: 'meta_target' {meta_target.tolist()} is not the OR of the rows of 'meta_matrix' "
            f"{meta.max(axis=0).tolist()}"
        )
    panels = np.ascontiguousarray(image) if with_image else None
    return RpmRecord(panels, target, meta, meta_target)


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
