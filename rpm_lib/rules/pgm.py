"""PGM rule sets and encodings: the (object, attribute, relation) triples of ``relation_structure_encoded``
(n, 12), the dense-12 and sparse-50 labels, the triples back from a sparse-50 vector, and PGM's
position-preserving test. The layouts are described in the ``rpm_lib.rules`` package docstring.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpm_lib.rules.arrays import _active, _binary_array
from rpm_lib.rules.vocabulary import (
    PGM_ATTRIBUTES,
    PGM_META_TARGET_FORMAT,
    PGM_OBJECTS,
    PGM_RELATIONS,
    PGM_SPARSE_DIM,
    PgmTriple,
)

_N_OBJ, _N_ATTR, _N_REL = len(PGM_OBJECTS), len(PGM_ATTRIBUTES), len(PGM_RELATIONS)


def _pgm_matrix(relation_structure_encoded: np.ndarray) -> np.ndarray:
    matrix = _binary_array(relation_structure_encoded, "relation_structure_encoded", 2, len(PGM_META_TARGET_FORMAT))
    if matrix.shape[0] < 1:
        raise ValueError("relation_structure_encoded: no rows")
    return matrix


def pgm_triples(relation_structure_encoded: np.ndarray) -> list[PgmTriple]:
    """The (object, attribute, relation) triples of one PGM problem, in row order.

    Args:
        relation_structure_encoded: (n, 12) 0/1 (n = 4 in the release; all-zero rows are unused slots).

    Raises:
        ValueError: a non-zero row without exactly one object, one attribute and one relation bit, or no
        triple at all.
    """
    matrix = _pgm_matrix(relation_structure_encoded)
    triples: list[PgmTriple] = []
    for i, row in enumerate(matrix):
        if not row.any():
            continue
        o = np.flatnonzero(row[:_N_OBJ])
        a = np.flatnonzero(row[_N_OBJ : _N_OBJ + _N_ATTR])
        r = np.flatnonzero(row[_N_OBJ + _N_ATTR :])
        if not (len(o) == len(a) == len(r) == 1):
            raise ValueError(
                f"relation_structure_encoded row {i} {row.tolist()}: expected exactly one object (cols 0-1), "
                f"one attribute (cols 2-6) and one relation (cols 7-11)"
            )
        triples.append((PGM_OBJECTS[o[0]], PGM_ATTRIBUTES[a[0]], PGM_RELATIONS[r[0]]))
    if not triples:
        raise ValueError("relation_structure_encoded: all rows are zero (no rule)")
    return triples


def pgm_dense(relation_structure_encoded: np.ndarray) -> np.ndarray:
    """Dense-12 label: float32 (12,) OR over rows (columns ``PGM_META_TARGET_FORMAT``) = ``meta_target``."""
    return _pgm_matrix(relation_structure_encoded).max(axis=0).astype(np.float32)


def pgm_sparse_index(obj: str, attribute: str, relation: str) -> int:
    """Sparse-50 index ``25*object + 5*attribute + relation`` of a triple (block-local indices)."""
    return _N_ATTR * _N_REL * PGM_OBJECTS.index(obj) + _N_REL * PGM_ATTRIBUTES.index(attribute) + PGM_RELATIONS.index(relation)


def pgm_sparse(relation_structure_encoded: np.ndarray) -> np.ndarray:
    """Sparse-50 label: float32 (50,), one bit per triple (see ``pgm_sparse_index``). Validates rows."""
    out = np.zeros(PGM_SPARSE_DIM, dtype=np.float32)
    for triple in pgm_triples(relation_structure_encoded):
        out[pgm_sparse_index(*triple)] = 1.0
    return out


def pgm_sparse_batch(relation_structures: np.ndarray) -> np.ndarray:
    """Sparse-50 labels of many problems: (N, n, 12) 0/1 -> float32 (N, 50). Assumes well-formed rows."""
    matrices = _binary_array(relation_structures, "relation_structures", 3, len(PGM_META_TARGET_FORMAT)).astype(bool)
    obj, attr, rel = (
        matrices[..., :_N_OBJ],
        matrices[..., _N_OBJ : _N_OBJ + _N_ATTR],
        matrices[..., _N_OBJ + _N_ATTR :],
    )
    cells = (obj[..., :, None, None] & attr[..., None, :, None] & rel[..., None, None, :]).any(axis=1)
    return cells.reshape(len(matrices), PGM_SPARSE_DIM).astype(np.float32)


def decode_pgm_sparse_triples(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[PgmTriple]:
    """Triples encoded by a sparse-50 vector (entries > ``threshold`` are on), in index order."""
    triples = []
    for index in _active(vector, PGM_SPARSE_DIM, "sparse-50 vector", threshold):
        o, rest = divmod(int(index), _N_ATTR * _N_REL)
        a, r = divmod(rest, _N_REL)
        triples.append((PGM_OBJECTS[o], PGM_ATTRIBUTES[a], PGM_RELATIONS[r]))
    return triples


def pgm_requires_position_preserving(relation_structure_encoded: np.ndarray) -> bool:
    """True when a row has position (col 4) and progression (col 7) (the official MLCL rule for PGM)."""
    matrix = _pgm_matrix(relation_structure_encoded)
    return bool((matrix[:, 4] & matrix[:, 7]).any())
