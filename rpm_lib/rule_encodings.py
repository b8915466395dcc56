"""The registry of rule encodings: the one place that says what ``dense``, ``sparse38``, ``sparse40``,
``sparse45`` and ``sparse50`` mean for a dataset.

Configuration validation, the data module, training metrics, notebooks and figures all ask this registry
(``rule_encoding(name, dataset)``) for the width, the sample key a dataset stores the vector under, how to
encode labels, how to decode a vector into words, and the name of every slot. The bit layouts themselves
are in :mod:`rpm_lib.rules` (its module docstring has the tables).

Slot names are one naming everywhere (``metrics.json``, notebook 05, figures):

* RAVEN sparse: ``"component 0: Progression on Size"``, or ``"Left: Progression on Size"`` when the
  configuration is known (component names from ``rules.COMPONENT_NAMES``; a rule on a component the
  configuration lacks, which only a prediction can have, reads ``"component 1 (not in Center): ..."``); sparse-40's two slots that no
  rule maps to (Arithmetic on Type) are ``"unused slot 10"`` / ``"unused slot 32"``.
* dense: the column names (``rules.META_TARGET_FORMAT`` for RAVEN, ``rules.PGM_META_TARGET_FORMAT`` for PGM).
* PGM sparse-50: ``"progression on shape size"``.
* The Mesh (I-RAVEN-Mesh, ``meta_matrix`` rows 8..11): ``"Mesh: Progression on Position"`` in every
  configuration.

**I-RAVEN-Mesh.** ``sparse45`` (width 45) covers the Mesh: slots 0..37 are sparse-38 of the two shape
components, slots 38..44 the Mesh's Number/Position rule, one per rule, in the order of
``rules.MESH_SLOT_RULES``: Constant on Number/Position, Progression on Number, Progression on Position,
Arithmetic on Number, Arithmetic on Position, Distribute_Three on Number, Distribute_Three on Position.
The Mesh's Type / Size / Color rules are Constant in every problem (checked when a file is read) and get no
slot. A problem without a mesh (plain I-RAVEN, Attributeless-I-RAVEN) has all 7 Mesh slots off, so one
rule head of width 45 serves I-RAVEN pre-training and I-RAVEN-Mesh fine-tuning alike.

What the other RAVEN encodings do with a Mesh problem (``RuleEncoding.covers_mesh`` says it in code):
``sparse38`` and ``sparse40`` encode the shape components only and leave the Mesh out, as the reference
training code for I-RAVEN-Mesh does (its auxiliary target is the sparse-40 code of the first two
components); ``dense`` is the OR over all rows, Mesh included (= the file's ``meta_target``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rpm_lib import rules

#: The dataset families: I-RAVEN and RAVEN share one label format (``meta_matrix``), PGM has its own.
FAMILIES: dict[str, str] = {"iraven": "raven", "raven": "raven", "pgm": "pgm"}


@dataclass(frozen=True)
class RuleEncoding:
    """One rule encoding of one dataset family.

    Attributes:
        name: ``dense``, ``sparse38``, ``sparse40`` or ``sparse50``.
        family: ``raven`` (RAVEN and I-RAVEN) or ``pgm``.
        width: R, the length of the float32 multi-hot vector.
        sample_key: the dataset sample key holding the vector (``rules_sparse`` or ``rules_dense``).
        dataset_layout: the ``rule_encoding`` argument to give the dataset class: the sparse layout it
            computes for ``rules_sparse`` (for a dense encoding, the family's default sparse layout, which the
            dense vector does not depend on).
        description: one line for ``--help`` and docs.
        covers_mesh: whether the vector includes the rules of an I-RAVEN-Mesh Mesh (``meta_matrix`` rows
            8..11); False means the Mesh is left out (the shape components are still encoded).
    """

    name: str
    family: str
    width: int
    sample_key: str
    dataset_layout: str
    description: str
    _encode: Callable[[np.ndarray], np.ndarray]
    _decode: Callable[[np.ndarray, float, str | None], list[str]]
    covers_mesh: bool = False

    def __reduce__(self) -> tuple[Callable[[str, str], RuleEncoding], tuple[str, str]]:
        # Pickled as its registry key (data loader workers receive datasets by pickle; the functions inside
        # are lambdas), so an unpickled encoding is the registry's own object.
        return rule_encoding, (self.name, self.family)

    def encode_batch(self, labels: np.ndarray) -> np.ndarray:
        """float32 ``(N, R)`` vectors from ``N`` problems' labels: RAVEN ``meta_matrix`` ``(N, 8, 9)`` or
        ``(N, 12, 9)`` (rows 8..11: the Mesh), PGM ``relation_structure_encoded`` ``(N, n, 12)``."""
        return self._encode(np.asarray(labels))

    def decode(self, vector: np.ndarray | Sequence[float], threshold: float = 0.5,
               configuration: str | None = None) -> list[str]:
        """Readable rules of one vector (labels, or probabilities: entries > ``threshold`` are on), in the
        naming of :meth:`slot_names`; ``configuration`` names RAVEN components (Left / Right, Out / In, ...)."""
        return self._decode(np.asarray(vector, dtype=np.float64), threshold, configuration)

    def slot_names(self, configuration: str | None = None) -> list[str]:
        """The name of each of the R slots (see the module docstring); unique within the encoding."""
        if self.family == "raven" and self.name != "dense":
            return _raven_slot_names(self.name, configuration)
        names = []
        for j in range(self.width):
            one_hot = np.zeros(self.width)
            one_hot[j] = 1.0
            decoded = self.decode(one_hot, configuration=configuration)
            names.append(decoded[0] if decoded else f"unused slot {j}")
        return names


def _component_names(configuration: str | None) -> tuple[str, ...]:
    if configuration is None:
        return ()
    return rules.COMPONENT_NAMES[rules.resolve_configuration(configuration)]


def _raven_rule_words(rule: rules.RavenRule, configuration: str | None) -> str:
    names = _component_names(configuration)
    c = rule[0]
    if configuration is None or c < len(names) or c == rules.MESH_COMPONENT:  # the Mesh: "Mesh" everywhere
        return rules.format_raven_rule(rule, names or None)
    # A predicted rule on a component the configuration does not have: said so, not hidden.
    short = rules.SHORT_NAMES[rules.resolve_configuration(configuration)]
    return rules.format_raven_rule(rule, [f"component {k} (not in {short})" for k in range(c + 1)])


def _raven_slot_names(layout: str, configuration: str | None) -> list[str]:
    table = rules._raven_index(layout)
    names = [f"unused slot {j}" for j in range(rules.RAVEN_SPARSE_DIMS[layout])]
    for (c, r, a), index in np.ndenumerate(table):
        if index >= 0:
            names[int(index)] = _raven_rule_words((c, rules.RELATIONS[r], rules.ATTRIBUTES[a]), configuration)
    offset = rules.MESH_SLOT_OFFSET.get(layout)
    if offset is not None:
        for i, (relation, attribute) in enumerate(rules.MESH_SLOT_RULES):
            names[offset + i] = _raven_rule_words((rules.MESH_COMPONENT, relation, attribute), configuration)
    return names


def _decode_raven_sparse(layout: str) -> Callable[[np.ndarray, float, str | None], list[str]]:
    def decode(vector: np.ndarray, threshold: float, configuration: str | None) -> list[str]:
        found = rules.decode_raven_sparse_rules(vector, layout, threshold)
        return [_raven_rule_words(rule, configuration) for rule in found]

    return decode


_RAVEN_SPARSE_DESCRIPTIONS: dict[str, str] = {
    "sparse38": "one bit per (component, relation, attribute), the paper's layout (a Mesh is left out)",
    "sparse40": "one bit per (component, relation, attribute), the official MLCL code's layout (a Mesh is left out)",
    "sparse45": "sparse38 of the two shape components plus 7 slots for the Mesh's Number/Position rule "
                "(I-RAVEN-Mesh; all 7 off without a mesh)",
}


def _raven_sparse(layout: str) -> RuleEncoding:
    return RuleEncoding(
        name=layout, family="raven", width=rules.RAVEN_SPARSE_DIMS[layout], sample_key="rules_sparse",
        dataset_layout=layout, description=_RAVEN_SPARSE_DESCRIPTIONS[layout],
        _encode=lambda meta: rules.raven_sparse_batch(meta, layout), _decode=_decode_raven_sparse(layout),
        covers_mesh=layout in rules.MESH_SLOT_OFFSET)


def _raven_dense_batch(meta: np.ndarray) -> np.ndarray:
    return np.stack([rules.raven_dense(m) for m in meta]) if len(meta) else np.zeros((0, 9), np.float32)


def _pgm_dense_batch(structures: np.ndarray) -> np.ndarray:
    width = len(rules.PGM_META_TARGET_FORMAT)
    return np.stack([rules.pgm_dense(s) for s in structures]) if len(structures) else np.zeros((0, width), np.float32)


_ENCODINGS: dict[tuple[str, str], RuleEncoding] = {
    ("raven", "dense"): RuleEncoding(
        name="dense", family="raven", width=len(rules.META_TARGET_FORMAT), sample_key="rules_dense",
        dataset_layout="sparse38",
        description="OR of the rules' relation and attribute columns, a Mesh's included (= meta_target)",
        _encode=_raven_dense_batch, _decode=lambda v, t, _c: rules.decode_raven_dense(v, t), covers_mesh=True),
    ("raven", "sparse38"): _raven_sparse("sparse38"),
    ("raven", "sparse40"): _raven_sparse("sparse40"),
    ("raven", "sparse45"): _raven_sparse("sparse45"),
    ("pgm", "dense"): RuleEncoding(
        name="dense", family="pgm", width=len(rules.PGM_META_TARGET_FORMAT), sample_key="rules_dense",
        dataset_layout="sparse50", description="OR of the triples' object, attribute and relation columns",
        _encode=_pgm_dense_batch, _decode=lambda v, t, _c: rules.decode_pgm_dense(v, t)),
    ("pgm", "sparse50"): RuleEncoding(
        name="sparse50", family="pgm", width=rules.PGM_SPARSE_DIM, sample_key="rules_sparse",
        dataset_layout="sparse50", description="one bit per (object, attribute, relation) triple",
        _encode=rules.pgm_sparse_batch, _decode=lambda v, t, _c: rules.decode_pgm_sparse(v, t)),
}

#: Every encoding name a configuration may ask for (``auto`` is resolved by the configuration).
ENCODING_NAMES: tuple[str, ...] = tuple(dict.fromkeys(name for _family, name in _ENCODINGS))


def encodings_for(dataset: str) -> tuple[str, ...]:
    """The encoding names valid for ``dataset`` (``iraven``, ``raven`` or ``pgm``)."""
    family = _family(dataset)
    return tuple(name for fam, name in _ENCODINGS if fam == family)


def default_sparse(dataset: str, mesh: bool = False) -> str:
    """The sparse encoding a dataset uses unless told otherwise: sparse38 (RAVEN), sparse45 (RAVEN data with
    a Mesh, ``mesh=True``), sparse50 (PGM)."""
    if _family(dataset) == "pgm":
        return "sparse50"
    return "sparse45" if mesh else "sparse38"


def rule_encoding(name: str, dataset: str) -> RuleEncoding:
    """The encoding ``name`` of ``dataset``.

    Raises:
        ValueError: an unknown dataset, or an encoding that does not exist for it (the message lists those
        that do).
    """
    family = _family(dataset)
    try:
        return _ENCODINGS[(family, name)]
    except KeyError:
        raise ValueError(f"rule encoding {name!r} does not exist for {dataset}; "
                         f"use one of {', '.join(encodings_for(dataset))}") from None


def sparse_rule_encoding(name: str, dataset: str) -> RuleEncoding:
    """The sparse encoding ``name`` of ``dataset``, for a dataset's ``rules_sparse`` key (the dense vector is
    always in ``rules_dense``).

    Raises:
        ValueError: ``name`` is not a sparse encoding of ``dataset`` (the message lists those that are).
    """
    sparse = [n for n in encodings_for(dataset) if _ENCODINGS[(_family(dataset), n)].sample_key == "rules_sparse"]
    if name not in sparse:
        raise ValueError(f"unknown {dataset} rule_encoding {name!r}; expected one of {sparse} (the dense label is "
                         "always in sample['rules_dense'])")
    return _ENCODINGS[(_family(dataset), name)]


def _family(dataset: str) -> str:
    try:
        return FAMILIES[dataset]
    except KeyError:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(FAMILIES)}") from None
