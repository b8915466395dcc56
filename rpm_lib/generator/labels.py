"""The label arrays of a RAVEN / I-RAVEN .npz (docs/data-formats.md, "RAVEN .npz keys"), computed from a
``Problem``.

``meta_matrix`` (8, 9) uint8: row ``4 * component + group`` (group 0 Number/Position, 1 Type, 2 Size,
3 Color), a one-hot relation in columns 0..3 (Constant, Progression, Arithmetic, Distribute_Three) and
the attribute(s) in columns 4..8 (Number, Position, Type, Size, Color; the joint Constant rule on
"Number/Position" sets both 4 and 5). ``meta_target`` (9,) uint8 = OR over the rows.
``structure`` (L,) bytes: the pre-order serialisation of the scene tree with "/" closing markers.
``meta_structure`` (21,) uint8: multi-hot of the tree's node names over ``META_STRUCTURE_FORMAT``.

Mesh problems (docs/generator.md, "Mesh"; raven-datasets' format): ``meta_matrix`` is (12, 9) with the
Mesh's rule group in rows 8..11 in every configuration (rows 4..7 stay zero in a one-component
configuration), ``meta_target`` the OR over the 12 rows, ``structure`` gains the tokens ``Mesh``,
``Mesh_Layout`` and is stored as unicode (``<U``, as Python 3 ``np.savez`` wrote the reference files);
``meta_structure`` is unchanged (no Mesh node in ``META_STRUCTURE_FORMAT``). raven-datasets' extra key
``meta_answer_mods`` is deliberately not produced: its all-zero block marks the answer.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from rpm_lib.generator.constants import CONFIG_SPECS, META_STRUCTURE_FORMAT, configuration_components
from rpm_lib.generator.problem import Problem, Rule
from rpm_lib.rules import MESH_COMPONENT, MESH_META_ROWS, META_ROWS

RELATION_COLUMNS: dict[str, int] = {"Constant": 0, "Progression": 1, "Arithmetic": 2, "Distribute_Three": 3}
ATTRIBUTE_COLUMNS: dict[str, tuple[int, ...]] = {
    "Number": (4,), "Position": (5,), "Number/Position": (4, 5), "Type": (6,), "Size": (7,), "Color": (8,),
}
#: Row of an attribute inside its component's 4-row block.
ATTRIBUTE_GROUP: dict[str, int] = {"Number": 0, "Position": 0, "Number/Position": 0, "Type": 1, "Size": 2, "Color": 3}


#: The Mesh's rule block always starts at row 8 (``rules.MESH_COMPONENT`` 2 x 4 rule groups).
MESH_FIRST_ROW = 4 * MESH_COMPONENT


def meta_matrix(rules: list[Rule], mesh_component: int | None = None) -> np.ndarray:
    """uint8 rule matrix: ``(8, 9)`` of 4 (one component) or 8 (two components) rules; with the Mesh at
    component ``mesh_component`` (1 or 2), ``(12, 9)`` with the Mesh's rules in rows 8..11."""
    if mesh_component not in (None, 1, 2):
        raise ValueError(f"the Mesh is component 1 or 2, got {mesh_component}")
    shapes = 2 if mesh_component is None else mesh_component
    matrix = np.zeros((META_ROWS if mesh_component is None else MESH_META_ROWS, 9), np.uint8)
    for rule in rules:
        if rule.name not in RELATION_COLUMNS or rule.attr not in ATTRIBUTE_COLUMNS:
            raise ValueError(f"unknown rule {rule.name!r} on {rule.attr!r}")
        if rule.component == mesh_component:
            block = MESH_FIRST_ROW
        elif 0 <= rule.component < shapes:
            block = 4 * rule.component
        else:
            allowed = list(range(shapes)) + ([] if mesh_component is None else [mesh_component])
            raise ValueError(f"rule component must be one of {allowed}, got {rule.component}")
        row = block + ATTRIBUTE_GROUP[rule.attr]
        if matrix[row].any():
            raise ValueError(f"two rules on component {rule.component}, group {ATTRIBUTE_GROUP[rule.attr]}")
        matrix[row, RELATION_COLUMNS[rule.name]] = 1
        matrix[row, list(ATTRIBUTE_COLUMNS[rule.attr])] = 1
    return matrix


def meta_target(matrix: np.ndarray) -> np.ndarray:
    """uint8 ``(9,)``: bitwise OR of the rows of ``meta_matrix``."""
    return np.bitwise_or.reduce(np.asarray(matrix, np.uint8), axis=0)


@lru_cache(maxsize=None)
def structure_tokens(configuration: str, mesh: bool = False) -> tuple[str, ...]:
    """Pre-order node names with "/" after each closed node, e.g. center_single ->
    ``("Scene", "Singleton", "Grid", "Center_Single", "/", "/", "/", "/")``; with the Mesh ->
    ``(..., "Center_Single", "/", "/", "Mesh", "Mesh_Layout", "/", "/", "/", "/")``."""
    spec = CONFIG_SPECS.get(configuration)
    if spec is None:
        raise ValueError(f"unknown configuration {configuration!r}")
    components = configuration_components(configuration, mesh)
    # The reference serialises the tree as: a layout (leaf) -> "name./"; any other node ->
    # "name." + "".join(child + ".") + "/"; the token list is that string split on ".".
    def serialise(name: str, children: list) -> str:
        if not children:
            return name + "./"
        return name + "." + "".join(serialise(*child) + "." for child in children) + "/"

    tree = [(spec.structure, [(component, [(layout, [])]) for component, layout in components])]
    text = serialise("Scene", tree)
    return tuple(text.split("."))


def structure(configuration: str, mesh: bool = False) -> np.ndarray:
    """The ``structure`` array ``(L,)``: bytes, dtype ``S<longest name>`` (as Python 2 ``np.savez`` wrote
    I-RAVEN); with the Mesh unicode, dtype ``<U<longest name>`` (as the I-RAVEN-Mesh files have it)."""
    tokens = structure_tokens(configuration, mesh)
    if mesh:
        return np.array(tokens)
    return np.array([token.encode("ascii") for token in tokens])


def meta_structure(configuration: str) -> np.ndarray:
    """uint8 ``(21,)`` multi-hot of the configuration's node names over ``META_STRUCTURE_FORMAT``."""
    vector = np.zeros(len(META_STRUCTURE_FORMAT), np.uint8)
    for token in structure_tokens(configuration):
        if token in META_STRUCTURE_FORMAT:
            vector[META_STRUCTURE_FORMAT.index(token)] = 1
    return vector


def problem_labels(problem: Problem) -> dict[str, np.ndarray]:
    """All label arrays of ``problem``: ``meta_matrix``, ``meta_target``, ``structure``, ``meta_structure``
    (Mesh problems: the 12-row ``meta_matrix`` and the Mesh tokens, see the module docstring)."""
    mesh = problem.has_mesh
    n_components = len(configuration_components(problem.configuration, mesh))
    filled = sorted({r.component for r in problem.rules})
    if filled != list(range(n_components)) or len(problem.rules) != 4 * n_components:
        raise ValueError(
            f"{problem.configuration}{' + Mesh' if mesh else ''} needs 4 rules on each of its {n_components} "
            f"component(s); got {len(problem.rules)} on components {filled}"
        )
    matrix = meta_matrix(problem.rules, n_components - 1 if mesh else None)
    return {
        "meta_matrix": matrix,
        "meta_target": meta_target(matrix),
        "structure": structure(problem.configuration, mesh),
        "meta_structure": meta_structure(problem.configuration),
    }
