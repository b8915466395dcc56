"""RAVEN / I-RAVEN rule sets and encodings: the validated rules of a ``meta_matrix`` (8 or 12, 9), the
dense-9 and sparse-38 / sparse-40 / sparse-45 labels (one problem or a batch), the rules back from a sparse
vector, and the position-preserving test (which also accepts a PGM label). The index layouts are tabulated
in the ``rpm_lib.rules`` package docstring.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpm_lib.rules.arrays import _active, _binary_array
from rpm_lib.rules.pgm import pgm_requires_position_preserving
from rpm_lib.rules.vocabulary import (
    ATTRIBUTES,
    MAX_COMPONENTS,
    MESH_COMPONENT,
    MESH_META_ROWS,
    MESH_SLOT_OFFSET,
    MESH_SLOT_RULES,
    META_ROWS,
    META_TARGET_FORMAT,
    NUMBER_POSITION,
    PGM_META_TARGET_FORMAT,
    RAVEN_SPARSE_DIMS,
    RELATIONS,
    RULE_GROUPS,
    RavenRule,
)


def _raven_index_table(layout: str) -> np.ndarray:
    """int64 (2, 4, 5): sparse index of (shape component, relation, attribute), -1 where not encodable.

    sparse-45's shape part is sparse-38; its Mesh slots are ``MESH_SLOT_OFFSET`` + ``MESH_SLOT_RULES``.
    """
    if layout not in RAVEN_SPARSE_DIMS:
        raise ValueError(f"unknown RAVEN sparse layout {layout!r}; expected one of {list(RAVEN_SPARSE_DIMS)}")
    table = np.full((MAX_COMPONENTS, len(RELATIONS), len(ATTRIBUTES)), -1, dtype=np.int64)
    for c in range(MAX_COMPONENTS):
        for r in range(len(RELATIONS)):
            for a in range(len(ATTRIBUTES)):
                if layout in ("sparse38", "sparse45"):
                    j = 5 * r + a
                    if j == 12:  # (Arithmetic, Type): never generated, not part of the paper's 38
                        continue
                    table[c, r, a] = 19 * c + j - (j > 12)
                else:  # sparse40
                    table[c, r, a] = 4 * a + r if c == 0 else 20 + 5 * r + a
    return table


_RAVEN_INDEX: dict[str, np.ndarray] = {layout: _raven_index_table(layout) for layout in RAVEN_SPARSE_DIMS}


def _raven_index(layout: str) -> np.ndarray:
    try:
        return _RAVEN_INDEX[layout]
    except KeyError:
        raise ValueError(
            f"unknown RAVEN sparse layout {layout!r}; expected one of {list(RAVEN_SPARSE_DIMS)}"
        ) from None


def _check_rows(rows: int, name: str, shape: tuple[int, ...]) -> None:
    if rows not in (META_ROWS, MESH_META_ROWS):
        lead = "N, " if len(shape) == 3 else ""
        raise ValueError(f"{name}: expected shape ({lead}{META_ROWS}, 9) or ({lead}{MESH_META_ROWS}, 9), got {shape}")


def has_mesh(meta_matrix: np.ndarray) -> bool:
    """True when a ``meta_matrix`` (8 or 12, 9) has a Mesh rule group, i.e. (12, 9) with non-zero rows 8..11."""
    matrix = _binary_array(meta_matrix, "meta_matrix", 2, len(META_TARGET_FORMAT))
    _check_rows(matrix.shape[0], "meta_matrix", matrix.shape)
    return bool(matrix[META_ROWS:].any())


def raven_rules_from_meta_matrix(meta_matrix: np.ndarray) -> list[RavenRule]:
    """The rules of one RAVEN problem, validated.

    Args:
        meta_matrix: (8, 9) or (12, 9) 0/1 array (any integer, bool or float dtype); rows 8..11 are the Mesh.

    Returns:
        ``[(component, relation, attribute), ...]`` in ``meta_matrix`` row order (component 0 first, then
        groups Number/Position, Type, Size, Color): 4 rules per present component, the Mesh last as
        component ``MESH_COMPONENT`` (2). The joint Constant rule on the layout is ONE entry with attribute
        ``"Number/Position"``.

    Raises:
        ValueError: wrong shape or values, a row without exactly one relation bit, attributes that do not
        match the row's rule group, Arithmetic on Type, a Mesh rule other than Constant on Type / Size /
        Color, or component 0 absent.
    """
    matrix = _binary_array(meta_matrix, "meta_matrix", 2, len(META_TARGET_FORMAT))
    _check_rows(matrix.shape[0], "meta_matrix", matrix.shape)
    rows = matrix.tolist()  # plain lists: this runs once per sample, numpy calls per row are slower
    rules: list[RavenRule] = []
    for c in range(len(rows) // 4):
        block = rows[4 * c : 4 * c + 4]
        if not any(any(row) for row in block):
            if c == 0:
                raise ValueError("meta_matrix: rows 0-3 (component 0) are all zero")
            continue  # 1-component configuration, or no Mesh
        for g, row in enumerate(block):
            where = f"meta_matrix row {4 * c + g} {row}"
            relation_bits = [i for i in range(4) if row[i]]
            if len(relation_bits) != 1:
                raise ValueError(f"{where}: expected exactly one relation bit in columns 0-3")
            relation = RELATIONS[relation_bits[0]]
            attributes = tuple(ATTRIBUTES[a] for a in range(len(ATTRIBUTES)) if row[4 + a])
            if g == 0:
                if relation == "Constant" and attributes == ("Number", "Position"):
                    attribute = NUMBER_POSITION
                elif relation != "Constant" and attributes in (("Number",), ("Position",)):
                    attribute = attributes[0]
                else:
                    raise ValueError(
                        f"{where}: the Number/Position group needs Constant on both Number and Position, "
                        f"or another relation on exactly one of them; got {relation} on {list(attributes)}"
                    )
            elif attributes == (RULE_GROUPS[g],):
                attribute = attributes[0]
            else:
                raise ValueError(f"{where}: rule group {RULE_GROUPS[g]} must govern exactly {RULE_GROUPS[g]}, got {list(attributes)}")
            if (relation, attribute) == ("Arithmetic", "Type"):
                raise ValueError(f"{where}: Arithmetic on Type never occurs in RAVEN")
            if c == MESH_COMPONENT and g > 0 and relation != "Constant":
                # The Mesh's lines have one type, size and colour: any other rule is a corrupt label, and
                # sparse-45 (which gives these rules no slot) would otherwise drop it silently.
                raise ValueError(f"{where}: the Mesh's {attribute} is always Constant, got {relation}")
            rules.append((c, relation, attribute))
    return rules


def raven_dense(meta_matrix: np.ndarray) -> np.ndarray:
    """Dense-9 label: float32 (9,) OR over the rows of ``meta_matrix`` (8 or 12 rows, so a Mesh's rules are
    included; columns ``META_TARGET_FORMAT``). Equals the file's ``meta_target``.
    """
    matrix = _binary_array(meta_matrix, "meta_matrix", 2, len(META_TARGET_FORMAT))
    return matrix.max(axis=0).astype(np.float32)


def _raven_cells(meta_matrices: np.ndarray) -> np.ndarray:
    """bool (N, 2, 4, 5): (shape component, relation, attribute) cells set by a batch of (N, 8, 9) matrices.

    A row's relation one-hot times its attribute bits gives its cells (Constant N/P: two cells).
    """
    rows = meta_matrices.reshape(-1, MAX_COMPONENTS, 4, len(META_TARGET_FORMAT)).astype(bool)
    cells = rows[..., :4, None] & rows[..., None, 4:]  # (N, c, group, relation, attribute)
    return cells.any(axis=2)


def _mesh_slots(rows: np.ndarray) -> np.ndarray:
    """float32 (N, 7): the ``MESH_SLOT_RULES`` slot set by each Mesh Number/Position row (N, 9) (row 8)."""
    rows = rows.astype(bool)
    number, position = rows[:, 4 + ATTRIBUTES.index("Number")], rows[:, 4 + ATTRIBUTES.index("Position")]
    out = np.zeros((len(rows), len(MESH_SLOT_RULES)), dtype=np.float32)
    for i, (relation, attribute) in enumerate(MESH_SLOT_RULES):
        on = {"Number": number, "Position": position, NUMBER_POSITION: number & position}[attribute]
        out[:, i] = rows[:, RELATIONS.index(relation)] & on
    return out


def raven_sparse_batch(meta_matrices: np.ndarray, layout: str = "sparse38") -> np.ndarray:
    """Sparse labels of many problems at once: (N, 8 or 12, 9) 0/1 -> float32 (N, 38 | 40 | 45).

    sparse-38 / sparse-40 encode rows 0..7 (the shape components; a Mesh is left out), sparse-45 also the
    Mesh's Number/Position rule (row 8). Assumes each matrix is well formed (``raven_rules_from_meta_matrix``
    passes); still raises ``ValueError`` when a rule has no slot in ``layout`` (Arithmetic on Type under
    sparse-38).
    """
    table = _raven_index(layout)
    matrices = _binary_array(meta_matrices, "meta_matrices", 3, len(META_TARGET_FORMAT))
    _check_rows(matrices.shape[1], "meta_matrices", matrices.shape)
    cells = _raven_cells(matrices[:, :META_ROWS])
    if (cells & (table < 0)).any():
        raise ValueError(f"meta_matrices: a rule (Arithmetic on Type) has no slot in layout {layout}")
    out = np.zeros((len(matrices), RAVEN_SPARSE_DIMS[layout]), dtype=np.float32)
    n, c, r, a = np.nonzero(cells)
    out[n, table[c, r, a]] = 1.0
    offset = MESH_SLOT_OFFSET.get(layout)
    if offset is not None and matrices.shape[1] == MESH_META_ROWS:
        out[:, offset : offset + len(MESH_SLOT_RULES)] = _mesh_slots(matrices[:, META_ROWS])
    return out


def raven_sparse(meta_matrix: np.ndarray, layout: str = "sparse38") -> np.ndarray:
    """Sparse label of one problem: float32 (38,) for ``"sparse38"`` (default), (40,) for ``"sparse40"``,
    (45,) for ``"sparse45"``.

    See the ``rpm_lib.rules`` package docstring for the index layouts and what each does with a Mesh. Validates ``meta_matrix``
    ((8, 9) or (12, 9)) first.
    """
    table = _raven_index(layout)
    offset = MESH_SLOT_OFFSET.get(layout)
    out = np.zeros(RAVEN_SPARSE_DIMS[layout], dtype=np.float32)
    for c, relation, attribute in raven_rules_from_meta_matrix(meta_matrix):
        if c == MESH_COMPONENT:
            # Mesh Type/Size/Color are always Constant (validated): no slot. Shape-only layouts skip the Mesh.
            if offset is not None and (relation, attribute) in MESH_SLOT_RULES:
                out[offset + MESH_SLOT_RULES.index((relation, attribute))] = 1.0
            continue
        r = RELATIONS.index(relation)
        for name in ("Number", "Position") if attribute == NUMBER_POSITION else (attribute,):
            out[table[c, r, ATTRIBUTES.index(name)]] = 1.0
    return out


def decode_raven_sparse_rules(
    vector: np.ndarray | Sequence[float], layout: str = "sparse38", threshold: float = 0.5
) -> list[RavenRule]:
    """Rules encoded by a sparse vector (labels or predicted probabilities; entries > ``threshold`` are on).

    Returns ``(component, relation, attribute)`` sorted by component, attribute, relation; a Constant
    Number bit together with the Constant Position bit of the same component becomes one
    ``(c, "Constant", "Number/Position")`` entry (one bit alone stays as it is). Under sparse-45 the Mesh's
    slots follow as ``(MESH_COMPONENT, relation, attribute)`` in slot order.
    """
    table = _raven_index(layout)
    offset = MESH_SLOT_OFFSET.get(layout, RAVEN_SPARSE_DIMS[layout])
    found: set[tuple[int, int, int]] = set()
    mesh: list[RavenRule] = []
    for index in _active(vector, RAVEN_SPARSE_DIMS[layout], f"{layout} vector", threshold):
        if index >= offset:
            mesh.append((MESH_COMPONENT, *MESH_SLOT_RULES[int(index) - offset]))
            continue
        c, r, a = (int(v[0]) for v in np.nonzero(table == index))
        found.add((c, r, a))
    number, position, constant = ATTRIBUTES.index("Number"), ATTRIBUTES.index("Position"), 0
    rules: list[tuple[int, int, int, str]] = []
    for c, r, a in sorted(found, key=lambda cra: (cra[0], cra[2], cra[1])):
        if r == constant and a in (number, position) and {(c, constant, number), (c, constant, position)} <= found:
            if a == number:
                rules.append((c, r, a, NUMBER_POSITION))
            continue
        rules.append((c, r, a, ATTRIBUTES[a]))
    return [(c, RELATIONS[r], name) for c, r, _a, name in rules] + mesh


def requires_position_preserving(meta_matrix: np.ndarray) -> bool:
    """True when the problem's rules depend on absolute positions, so only augmentations that move every
    panel's content as a whole are safe (the ``position_preserving`` recipe of ``rpm_lib.augment``: flips,
    90-degree and free rotations, transposes; no grid shuffle, no roll).

    RAVEN ``meta_matrix`` (8 or 12, 9): any row with (Progression or Arithmetic) and Position, i.e.
    ``(col1 or col2) and col5`` (the official MLCL rule), the Mesh's row included (its Progression on Position
    turns the whole mesh by 90 degrees per column). A PGM ``relation_structure_encoded`` (n, 12) is accepted
    too and dispatched to ``pgm_requires_position_preserving``.
    """
    arr = np.asarray(meta_matrix)
    if arr.ndim == 2 and arr.shape[1] == len(PGM_META_TARGET_FORMAT):
        return pgm_requires_position_preserving(arr)
    matrix = _binary_array(arr, "meta_matrix", 2, len(META_TARGET_FORMAT))
    return bool((((matrix[:, 1] | matrix[:, 2]) & matrix[:, 5]) > 0).any())
