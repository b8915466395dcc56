"""The ``.npz`` of one generated problem: its arrays (``npz_arrays``) and their deterministic, uncompressed zip
(``write_npz``), whose size is fixed per configuration (``expected_npz_size``).

The file holds ``target, predict, image, meta_matrix, meta_structure, meta_target, structure`` (the reference's key
order) in ``np.savez``'s uncompressed format. Two deliberate differences from ``np.savez``: the zip entries carry a
fixed timestamp (1980-01-01) so that equal problems give byte-identical files, and ``predict`` is ``target`` (the
reference generators' heuristic solver chose the target in all 2,240 problems checked, so the solver is not
re-implemented; docs/generator.md, "Deliberate differences from the reference generators"). An I-RAVEN-Mesh problem
has a (12, 9) ``meta_matrix`` (the Mesh's rules in rows 8..11) and the Mesh tokens in ``structure``.
"""
from __future__ import annotations

import io
import struct
import zlib
from functools import lru_cache

import numpy as np

from rpm_lib.generator.labels import problem_labels, structure
from rpm_lib.generator.problem import Problem
from rpm_lib.generator.render import render_problem
from rpm_lib.rules import MESH_META_ROWS, META_ROWS


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
