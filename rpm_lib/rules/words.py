"""Labels in words: a RAVEN rule as ``"Left: Progression on Size"``, the rules of a ``meta_matrix`` named by
configuration, and the readable content of dense / sparse RAVEN and PGM vectors (labels or predicted
probabilities).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rpm_lib.rules.arrays import _active
from rpm_lib.rules.pgm import decode_pgm_sparse_triples
from rpm_lib.rules.raven import decode_raven_sparse_rules, raven_rules_from_meta_matrix
from rpm_lib.rules.vocabulary import (
    COMPONENT_NAMES,
    MESH_COMPONENT,
    MESH_NAME,
    META_TARGET_FORMAT,
    PGM_META_TARGET_FORMAT,
    RavenRule,
    component_names,
    resolve_configuration,
)


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


def decode_pgm_sparse(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[str]:
    """Readable triples of a sparse-50 vector, e.g. ``["AND on shape position"]``."""
    return [f"{r} on {o} {a}" for o, a, r in decode_pgm_sparse_triples(vector, threshold)]


def decode_pgm_dense(vector: np.ndarray | Sequence[float], threshold: float = 0.5) -> list[str]:
    """Names (``PGM_META_TARGET_FORMAT``) of the active entries of a dense-12 vector."""
    return [PGM_META_TARGET_FORMAT[i] for i in _active(vector, len(PGM_META_TARGET_FORMAT), "dense-12 vector", threshold)]
