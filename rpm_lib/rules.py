"""Rule vocabularies and rule encodings for RAVEN / I-RAVEN and PGM.

RAVEN / I-RAVEN labels come from ``meta_matrix`` (8, 9) uint8: row ``4*c + g`` is component ``c`` (0, 1) and
rule group ``g`` (0 Number/Position, 1 Type, 2 Size, 3 Color); columns are ``META_TARGET_FORMAT`` (one-hot
relation in columns 0..3, governed attribute(s) in columns 4..8). The joint "Constant on Number/Position"
rule sets both the Number and the Position column. Rows 4..7 are zero for 1-component configurations.

Files written by raven-datasets (Attributeless-I-RAVEN, I-RAVEN-Mesh) have a (12, 9) ``meta_matrix``: rows
8..11 are the **Mesh** (I-RAVEN-Mesh's rule-governed line mesh, drawn over the shapes) in every
configuration, and all zero when there is no mesh. Here the mesh is component ``MESH_COMPONENT`` = 2 (its
meta block, not its .xml ``<Component id>``, which is 1 or 2), named ``"Mesh"`` in every configuration.
Only its Number/Position rule varies; its Type, Size and Color rules are always Constant (those attributes
have one value), and a matrix saying otherwise is refused. Every function below accepts (8, 9) and (12, 9);
a (12, 9) matrix with zero rows 8..11 means exactly what its first 8 rows mean.

Encodings (all ``float32`` multi-hot vectors; the OR over the rules of one problem):

* **dense-9** (``raven_dense``): OR over the rows of ``meta_matrix`` = the file's ``meta_target``; columns
  ``META_TARGET_FORMAT``. Ambiguous (loses which relation goes with which attribute / component).
* **sparse-38** (``raven_sparse(..., layout="sparse38")``, the paper's encoding, default): one bit per
  (component, relation, attribute) that can occur. With relation index ``r`` (Constant 0, Progression 1,
  Arithmetic 2, Distribute_Three 3) and attribute index ``a`` (Number 0, Position 1, Type 2, Size 3,
  Color 4): ``j = 5*r + a``; ``j == 12`` (Arithmetic, Type) never occurs and is dropped:
  ``j' = j - (j > 12)``; ``index = 19*c + j'``. Per component (add 19 for component 1):

  ====  ========================  ====  ========================
  j'    (relation, attribute)     j'    (relation, attribute)
  ====  ========================  ====  ========================
  0     Constant, Number          10    Arithmetic, Number
  1     Constant, Position        11    Arithmetic, Position
  2     Constant, Type            12    Arithmetic, Size
  3     Constant, Size            13    Arithmetic, Color
  4     Constant, Color           14    Distribute_Three, Number
  5     Progression, Number       15    Distribute_Three, Position
  6     Progression, Position     16    Distribute_Three, Type
  7     Progression, Type         17    Distribute_Three, Size
  8     Progression, Size         18    Distribute_Three, Color
  9     Progression, Color
  ====  ========================  ====  ========================

  Constant on Number/Position sets both bits 0 and 1 (as the data does).
* **sparse-40** (``layout="sparse40"``, the official MLCL code's layout, kept for compatibility): component
  0: ``index = 4*a + r`` (attribute-major); component 1: ``index = 20 + 5*r + a`` (relation-major). Slots 10
  and 32 (Arithmetic, Type) are always 0.
* **sparse-45** (``layout="sparse45"``, covers the Mesh): slots 0..37 are sparse-38 of the two shape
  components; slots 38..44 are the Mesh's Number/Position rule, one slot per rule (``MESH_SLOT_RULES``):
  38 Constant on Number/Position, 39 Progression on Number, 40 Progression on Position, 41 Arithmetic on
  Number, 42 Arithmetic on Position, 43 Distribute_Three on Number, 44 Distribute_Three on Position. A Mesh
  problem sets exactly one of them; a problem without a mesh none. The Mesh's Type/Size/Color rules get no
  slot: they are Constant in every problem, so a slot would carry no information.

**What the two-component layouts do with a Mesh problem:** sparse-38 and sparse-40 encode the shape
components only (rows 0..7) and leave the Mesh out, as the reference training code for I-RAVEN-Mesh does
(its auxiliary target is the sparse-40 code of the first two components). Use sparse-45 to include it.
dense-9 is the OR over *all* rows, mesh included, i.e. the file's ``meta_target``.

PGM labels come from ``relation_structure_encoded`` (4, 12): one row per (object, attribute, relation)
triple (unused rows zero), columns ``PGM_META_TARGET_FORMAT`` (objects 0..1, attributes 2..6, relations
7..11). **dense-12** (``pgm_dense``) = OR over rows = ``meta_target``. **sparse-50** (``pgm_sparse``, the
official layout): ``index = 25*object + 5*attribute + relation`` with the block-local indices of
``PGM_OBJECTS``, ``PGM_ATTRIBUTES``, ``PGM_RELATIONS``.

Every parser raises ``ValueError`` naming the offending row when a label array is malformed; the data
layer re-raises it as ``rpm_lib.data.DataFormatError`` with the file name.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------
# RAVEN / I-RAVEN vocabulary
# ----------------------------------------------------------------------------------------------

#: The 7 configurations: on-disk folder names, in the order used everywhere in rpm_lib (tables, plots).
CONFIGURATIONS: tuple[str, ...] = (
    "center_single",
    "distribute_four",
    "distribute_nine",
    "left_center_single_right_center_single",
    "up_center_single_down_center_single",
    "in_center_single_out_center_single",
    "in_distribute_four_out_center_single",
)

#: The paper's short names (Table 1 columns).
SHORT_NAMES: dict[str, str] = {
    "center_single": "Center",
    "distribute_four": "2x2Grid",
    "distribute_nine": "3x3Grid",
    "left_center_single_right_center_single": "L-R",
    "up_center_single_down_center_single": "U-D",
    "in_center_single_out_center_single": "O-IC",
    "in_distribute_four_out_center_single": "O-IG",
}

#: The 4 relations (columns 0..3 of ``meta_matrix`` / ``meta_target``).
RELATIONS: tuple[str, ...] = ("Constant", "Progression", "Arithmetic", "Distribute_Three")

#: The 5 ruled attributes (columns 4..8 of ``meta_matrix`` / ``meta_target``).
ATTRIBUTES: tuple[str, ...] = ("Number", "Position", "Type", "Size", "Color")

#: ``meta_target`` column names (9).
META_TARGET_FORMAT: tuple[str, ...] = RELATIONS + ATTRIBUTES

#: Rule groups, i.e. the row inside a component's 4-row block of ``meta_matrix``.
RULE_GROUPS: tuple[str, ...] = ("Number/Position", "Type", "Size", "Color")

#: Component names per configuration, component index 0 first (as in the .xml ``<Component id=...>``).
COMPONENT_NAMES: dict[str, tuple[str, ...]] = {
    "center_single": ("Grid",),
    "distribute_four": ("Grid",),
    "distribute_nine": ("Grid",),
    "left_center_single_right_center_single": ("Left", "Right"),
    "up_center_single_down_center_single": ("Up", "Down"),
    "in_center_single_out_center_single": ("Out", "In"),
    "in_distribute_four_out_center_single": ("Out", "In"),
}

#: At most 2 (shape) components per configuration; ``meta_matrix`` has 4 rows (rule groups) per component.
MAX_COMPONENTS: int = 2

#: Rows of a plain RAVEN / I-RAVEN ``meta_matrix`` (2 components x 4 rule groups).
META_ROWS: int = 4 * MAX_COMPONENTS

#: The Mesh of I-RAVEN-Mesh: its meta block (rows 8..11) and its name, the same in every configuration.
MESH_COMPONENT: int = MAX_COMPONENTS
MESH_NAME: str = "Mesh"

#: Rows of a raven-datasets ``meta_matrix`` (the two shape components, then the Mesh).
MESH_META_ROWS: int = META_ROWS + 4


def component_names(configuration: str, mesh: bool = False) -> dict[int, str]:
    """Names of a configuration's components keyed by their ``meta_matrix`` block ``c`` (rows ``4c..4c+3``).

    Args:
        configuration: folder or short name.
        mesh: the problems have a Mesh (I-RAVEN-Mesh): block ``MESH_COMPONENT`` (rows 8..11) is ``"Mesh"``.

    Example: ``component_names("Center", mesh=True) == {0: "Grid", 2: "Mesh"}``.
    """
    names = dict(enumerate(COMPONENT_NAMES[resolve_configuration(configuration)]))
    if mesh:
        names[MESH_COMPONENT] = MESH_NAME
    return names


def component_legend() -> str:
    """What "component k" means across configurations, e.g. ``"component 0: Grid, Left, Up or Out; ..."``.

    For figures that mix configurations and so cannot name components by one configuration. Only the
    shape components are numbered: the Mesh is called ``"Mesh"`` everywhere (``MESH_NAME``), so slot names
    never say "component 2".
    """
    parts = []
    for k in range(MAX_COMPONENTS):
        names = list(dict.fromkeys(n[k] for n in COMPONENT_NAMES.values() if len(n) > k))
        parts.append(f"component {k}: " + (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]))
    return "; ".join(parts)

#: The name under which the joint Constant rule on the layout is serialised (.xml ``attr``).
NUMBER_POSITION: str = "Number/Position"

#: The 19 (relation, attribute) pairs that can govern a component, in the canonical sparse-38 order
#: ``j = 5 * relation + attribute`` with the never-occurring ``(Arithmetic, Type)`` (j = 12) removed.
#: Constant appears on Number and on Position separately: the joint "Constant on Number/Position" rule
#: sets both bits (as ``meta_matrix`` does).
RAVEN_RULE_PAIRS: tuple[tuple[str, str], ...] = tuple(
    (relation, attribute)
    for relation in RELATIONS
    for attribute in ATTRIBUTES
    if (relation, attribute) != ("Arithmetic", "Type")
)

#: The Mesh's Number/Position rules in the order of their sparse-45 slots (38 + i). The Mesh's Type, Size
#: and Color rules are always Constant and have no slot.
MESH_SLOT_RULES: tuple[tuple[str, str], ...] = (("Constant", NUMBER_POSITION),) + tuple(
    (relation, attribute) for relation in RELATIONS[1:] for attribute in ("Number", "Position")
)

#: Length of each RAVEN sparse layout.
RAVEN_SPARSE_DIMS: dict[str, int] = {"sparse38": 38, "sparse40": 40, "sparse45": 38 + len(MESH_SLOT_RULES)}

#: First Mesh slot of the layouts that cover the Mesh (the others encode the shape components only).
MESH_SLOT_OFFSET: dict[str, int] = {"sparse45": 38}

#: A RAVEN rule: (component index, relation, attribute); attribute is ``"Number/Position"`` for the
#: joint Constant rule on the layout.
RavenRule = tuple[int, str, str]

# ----------------------------------------------------------------------------------------------
# PGM vocabulary (deepmind/abstract-reasoning-matrices)
# ----------------------------------------------------------------------------------------------

#: The 8 generalisation regimes (folder / file-name spelling of the release).
PGM_REGIMES: tuple[str, ...] = (
    "neutral",
    "interpolation",
    "extrapolation",
    "attr.rel.pairs",
    "attr.rels",
    "attrs.pairs",
    "attrs.shape.color",
    "attrs.line.type",
)

#: Objects (columns 0..1 of ``relation_structure_encoded`` / ``meta_target``).
PGM_OBJECTS: tuple[str, ...] = ("shape", "line")

#: Attributes (columns 2..6).
PGM_ATTRIBUTES: tuple[str, ...] = ("color", "number", "position", "size", "type")

#: Relations (columns 7..11).
PGM_RELATIONS: tuple[str, ...] = ("progression", "XOR", "OR", "AND", "consistent_union")

#: PGM ``meta_target`` / ``relation_structure_encoded`` column names (12).
PGM_META_TARGET_FORMAT: tuple[str, ...] = PGM_OBJECTS + PGM_ATTRIBUTES + PGM_RELATIONS

#: Length of the PGM sparse encoding (2 objects x 5 attributes x 5 relations).
PGM_SPARSE_DIM: int = 50

#: A PGM rule: (object, attribute, relation), e.g. ``("shape", "position", "AND")``.
PgmTriple = tuple[str, str, str]


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


def resolve_configuration(name: str) -> str:
    """Folder name of a RAVEN configuration given its folder name or the paper's short name (any case).

    Raises ``ValueError`` for an unknown name (the message lists the valid ones).
    """
    if name in CONFIGURATIONS:
        return name
    for folder, short in SHORT_NAMES.items():
        if str(name).lower() in (short.lower(), folder):
            return folder
    raise ValueError(
        f"unknown RAVEN configuration {name!r}; expected one of {list(CONFIGURATIONS)} "
        f"or a short name {list(SHORT_NAMES.values())}"
    )


def resolve_configurations(names: str | Sequence[str] | None, allow_duplicates: bool = True) -> list[str]:
    """Folder names, in the given order, for a list of folder or short names: the one resolver behind the
    configuration field, the datasets and ``rpm-generate --configurations``.

    Args:
        names: ``None`` or ``"all"`` (all 7 in ``CONFIGURATIONS`` order), a comma-separated string, or a list.
        allow_duplicates: a name given twice is kept once; with ``False`` it is an error instead.

    Raises:
        ValueError: an unknown name, a duplicate (when not allowed), an empty item (``Center,,L-R``) or an empty list.
    """
    if names is None:
        return list(CONFIGURATIONS)
    if isinstance(names, str):
        text = names
        names = [n.strip() for n in names.split(",")] if names.strip() else []
        if "" in names:
            raise ValueError(f"empty item in the comma-separated list {text!r} (remove the extra comma)")
    names = list(names)
    if names == ["all"]:
        return list(CONFIGURATIONS)
    out: list[str] = []
    for name in names:
        folder = resolve_configuration(name)
        if folder in out and not allow_duplicates:
            raise ValueError(f"configuration {name!r} is listed twice")
        if folder not in out:
            out.append(folder)
    if not out:
        raise ValueError("empty list of configurations (use 'all' or null for all 7)")
    return out


def _binary_array(array: np.ndarray | Sequence, name: str, ndim: int, width: int) -> np.ndarray:
    """``array`` as a uint8 0/1 array with ``ndim`` dims whose last dim is ``width``; ValueError otherwise."""
    arr = np.asarray(array)
    if arr.ndim != ndim or arr.shape[-1] != width:
        raise ValueError(f"{name}: expected {ndim} dims with last dim {width}, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name}: expected a numeric 0/1 array, got dtype {arr.dtype}")
    if arr.size and not ((arr == 0) | (arr == 1)).all():
        raise ValueError(f"{name}: values must be 0 or 1, got {sorted(set(np.unique(arr).tolist()))}")
    return arr.astype(np.uint8)


def _active(vector: np.ndarray | Sequence, dim: int, name: str, threshold: float) -> np.ndarray:
    """Indices of the entries of a 1-D length-``dim`` vector that exceed ``threshold``."""
    vec = np.asarray(vector, dtype=np.float64)
    if vec.shape != (dim,):
        raise ValueError(f"{name}: expected a vector of shape ({dim},), got {vec.shape}")
    return np.flatnonzero(vec > threshold)


# ----------------------------------------------------------------------------------------------
# RAVEN / I-RAVEN: rules from meta_matrix and their encodings
# ----------------------------------------------------------------------------------------------


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

    See the module docstring for the index layouts and what each does with a Mesh. Validates ``meta_matrix``
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


def format_raven_rule(rule: RavenRule, component_names: Sequence[str] | Mapping[int, str] | None = None) -> str:
    """``"component 0: Progression on Size"``, or ``"Left: Progression on Size"`` with component names (a
    sequence indexed by component, or ``component_names(...)``'s mapping). The Mesh is always ``"Mesh"``."""
    c, relation, attribute = rule
    if component_names is not None and (c in component_names if isinstance(component_names, Mapping)
                                        else c < len(component_names)):
        who = component_names[c]
    elif c == MESH_COMPONENT:
        who = MESH_NAME
    else:
        who = f"component {c}"
    return f"{who}: {relation} on {attribute}"


def decode_raven_sparse(
    vector: np.ndarray | Sequence[float], layout: str = "sparse38", threshold: float = 0.5
) -> list[str]:
    """Readable rules of a sparse vector, e.g. ``["component 0: Constant on Number/Position", ...,
    "Mesh: Progression on Position"]``."""
    return [format_raven_rule(rule) for rule in decode_raven_sparse_rules(vector, layout, threshold)]


def decode_raven_dense(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[str]:
    """Names (``META_TARGET_FORMAT``) of the active entries of a dense-9 vector."""
    return [META_TARGET_FORMAT[i] for i in _active(vector, len(META_TARGET_FORMAT), "dense-9 vector", threshold)]


def describe_raven_rules(meta_matrix: np.ndarray, configuration: str | None = None) -> list[str]:
    """One readable line per rule, e.g. ``"Left: Progression on Size"`` or ``"Mesh: Progression on Position"``.

    Args:
        meta_matrix: (8, 9) or (12, 9) 0/1; a Mesh's 4 rules (rows 8..11) come last.
        configuration: folder or short name; when given, components are named (Grid / Left / Right / Up /
            Down / Out / In) and the number of shape components is checked against the configuration.
    """
    rules = raven_rules_from_meta_matrix(meta_matrix)
    if configuration is None:
        return [format_raven_rule(rule) for rule in rules]
    folder = resolve_configuration(configuration)
    names = COMPONENT_NAMES[folder]
    present = {c for c, _r, _a in rules if c != MESH_COMPONENT}
    if present != set(range(len(names))):
        raise ValueError(
            f"meta_matrix has rules for components {sorted(present)} but configuration {folder} "
            f"has {len(names)} component(s) {list(names)}"
        )
    mesh = any(c == MESH_COMPONENT for c, _r, _a in rules)
    return [format_raven_rule(rule, component_names(folder, mesh)) for rule in rules]


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


# ----------------------------------------------------------------------------------------------
# PGM: triples from relation_structure_encoded and their encodings
# ----------------------------------------------------------------------------------------------

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


def decode_pgm_sparse(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[str]:
    """Readable triples of a sparse-50 vector, e.g. ``["AND on shape position"]``."""
    return [f"{r} on {o} {a}" for o, a, r in decode_pgm_sparse_triples(vector, threshold)]


def decode_pgm_dense(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[str]:
    """Names (``PGM_META_TARGET_FORMAT``) of the active entries of a dense-12 vector."""
    return [PGM_META_TARGET_FORMAT[i] for i in _active(vector, len(PGM_META_TARGET_FORMAT), "dense-12 vector", threshold)]


def pgm_requires_position_preserving(relation_structure_encoded: np.ndarray) -> bool:
    """True when a row has position (col 4) and progression (col 7) (the official MLCL rule for PGM)."""
    matrix = _pgm_matrix(relation_structure_encoded)
    return bool((matrix[:, 4] & matrix[:, 7]).any())
