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

Modules (imports run one way, top to bottom): ``words`` (labels in words) -> ``raven`` (RAVEN rule sets and
encodings) -> ``pgm`` (PGM rule sets and encodings) -> ``arrays`` (label array checks) and ``vocabulary``
(the names). Import from ``rpm_lib.rules`` itself: every name is re-exported here.
"""

from __future__ import annotations

from rpm_lib.rules.pgm import (
    decode_pgm_sparse_triples,
    pgm_dense,
    pgm_requires_position_preserving,
    pgm_sparse,
    pgm_sparse_batch,
    pgm_sparse_index,
    pgm_triples,
)
from rpm_lib.rules.raven import (
    _raven_index as _raven_index,  # private, but rpm_lib.rule_encodings reads the slot table
)
from rpm_lib.rules.raven import (
    decode_raven_sparse_rules,
    has_mesh,
    raven_dense,
    raven_rules_from_meta_matrix,
    raven_sparse,
    raven_sparse_batch,
    requires_position_preserving,
)
from rpm_lib.rules.vocabulary import (
    ATTRIBUTES,
    COMPONENT_NAMES,
    CONFIGURATIONS,
    MAX_COMPONENTS,
    MESH_COMPONENT,
    MESH_META_ROWS,
    MESH_NAME,
    MESH_SLOT_OFFSET,
    MESH_SLOT_RULES,
    META_ROWS,
    META_TARGET_FORMAT,
    NUMBER_POSITION,
    PGM_ATTRIBUTES,
    PGM_META_TARGET_FORMAT,
    PGM_OBJECTS,
    PGM_REGIMES,
    PGM_RELATIONS,
    PGM_SPARSE_DIM,
    RAVEN_RULE_PAIRS,
    RAVEN_SPARSE_DIMS,
    RELATIONS,
    RULE_GROUPS,
    SHORT_NAMES,
    PgmTriple,
    RavenRule,
    component_legend,
    component_names,
    resolve_configuration,
    resolve_configurations,
)
from rpm_lib.rules.words import (
    decode_pgm_dense,
    decode_pgm_sparse,
    decode_raven_dense,
    decode_raven_sparse,
    describe_raven_rules,
    format_raven_rule,
)

__all__ = [
    # vocabulary
    "ATTRIBUTES",
    "COMPONENT_NAMES",
    "CONFIGURATIONS",
    "MAX_COMPONENTS",
    "MESH_COMPONENT",
    "MESH_META_ROWS",
    "MESH_NAME",
    "MESH_SLOT_OFFSET",
    "MESH_SLOT_RULES",
    "META_ROWS",
    "META_TARGET_FORMAT",
    "NUMBER_POSITION",
    "PGM_ATTRIBUTES",
    "PGM_META_TARGET_FORMAT",
    "PGM_OBJECTS",
    "PGM_REGIMES",
    "PGM_RELATIONS",
    "PGM_SPARSE_DIM",
    "RAVEN_RULE_PAIRS",
    "RAVEN_SPARSE_DIMS",
    "RELATIONS",
    "RULE_GROUPS",
    "SHORT_NAMES",
    "PgmTriple",
    "RavenRule",
    "component_legend",
    "component_names",
    # in words
    "decode_pgm_dense",
    "decode_pgm_sparse",
    # PGM rule sets and encodings
    "decode_pgm_sparse_triples",
    "decode_raven_dense",
    "decode_raven_sparse",
    # RAVEN rule sets and encodings
    "decode_raven_sparse_rules",
    "describe_raven_rules",
    "format_raven_rule",
    "has_mesh",
    "pgm_dense",
    "pgm_requires_position_preserving",
    "pgm_sparse",
    "pgm_sparse_batch",
    "pgm_sparse_index",
    "pgm_triples",
    "raven_dense",
    "raven_rules_from_meta_matrix",
    "raven_sparse",
    "raven_sparse_batch",
    "requires_position_preserving",
    "resolve_configuration",
    "resolve_configurations",
]
