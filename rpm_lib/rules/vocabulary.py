"""The names of RAVEN / I-RAVEN and PGM labels: configurations and their short names, relations, attributes,
rule groups, components (the Mesh included), the columns of ``meta_matrix`` / ``meta_target`` and of PGM's
``relation_structure_encoded``, the slot counts of the sparse layouts, and the resolver from a configuration's
folder or short name to its folder name. Plain data and name look-ups only, no arrays: every other module of
``rpm_lib.rules`` builds on this one.
"""
from __future__ import annotations

from collections.abc import Sequence

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
# RAVEN configuration names (folder or short name -> folder name)
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
