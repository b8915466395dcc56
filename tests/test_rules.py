"""Rule vocabularies and encodings (rpm_lib.rules), checked against the reference .npz/.xml files."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from rpm_lib import rules


def xml_rules(xml_path: Path) -> set[tuple[int, str, str]]:
    """(component, relation, attribute) from the .xml ``<Rules>`` (attributes read by name)."""
    root = ET.parse(xml_path).getroot()
    out = set()
    for group in root.find("Rules").iter("Rule_Group"):
        for rule in group.iter("Rule"):
            out.add((int(group.get("id")), rule.get("name"), rule.get("attr")))
    return out


def xml_component_names(xml_path: Path) -> list[str]:
    panel = ET.parse(xml_path).getroot().find("Panels").find("Panel")
    return [c.get("name") for c in sorted(panel.iter("Component"), key=lambda c: int(c.get("id")))]


def reference_pairs(root: Path, configuration: str):
    for npz in sorted((root / configuration).glob("RAVEN_*.npz")):
        yield npz, npz.with_suffix(".xml")


def random_meta_matrix(rng: np.random.Generator, components: int) -> np.ndarray:
    """A valid meta_matrix with a uniformly chosen rule per (component, group)."""
    matrix = np.zeros((8, 9), dtype=np.uint8)
    for c in range(components):
        for g, group in enumerate(rules.RULE_GROUPS):
            if g == 0:
                options = [("Constant", ("Number", "Position"))] + [
                    (r, (a,)) for r in rules.RELATIONS[1:] for a in ("Number", "Position")
                ]
            else:
                options = [(r, (group,)) for r in rules.RELATIONS if (r, group) != ("Arithmetic", "Type")]
            relation, attributes = options[rng.integers(len(options))]
            matrix[4 * c + g, rules.RELATIONS.index(relation)] = 1
            for a in attributes:
                matrix[4 * c + g, 4 + rules.ATTRIBUTES.index(a)] = 1
    return matrix


# ------------------------------------------------------------------------------------------------
# vocabulary and layouts
# ------------------------------------------------------------------------------------------------


def test_feasible_pairs_are_the_19_without_arithmetic_on_type():
    assert len(rules.RAVEN_RULE_PAIRS) == 19 == len(set(rules.RAVEN_RULE_PAIRS))
    assert ("Arithmetic", "Type") not in rules.RAVEN_RULE_PAIRS
    assert {r for r, _ in rules.RAVEN_RULE_PAIRS} == set(rules.RELATIONS)
    assert {a for _, a in rules.RAVEN_RULE_PAIRS} == set(rules.ATTRIBUTES)
    assert rules.RAVEN_SPARSE_DIMS == {"sparse38": 38, "sparse40": 40, "sparse45": 45}


def test_component_names_cover_every_configuration():
    assert set(rules.COMPONENT_NAMES) == set(rules.CONFIGURATIONS)
    assert sum(len(v) for v in rules.COMPONENT_NAMES.values()) == 11


@pytest.mark.parametrize("layout", ["sparse38", "sparse40", "sparse45"])
def test_every_rule_pair_has_its_own_slot(layout):
    """Encode each single (component, relation, attribute) alone: all slots distinct and within range."""
    seen = {}
    for c in range(2):
        for relation, attribute in rules.RAVEN_RULE_PAIRS:
            vec = np.zeros(rules.RAVEN_SPARSE_DIMS[layout])
            index = int(rules._raven_index(layout)[c, rules.RELATIONS.index(relation), rules.ATTRIBUTES.index(attribute)])
            vec[index] = 1
            assert rules.decode_raven_sparse_rules(vec, layout) == [(c, relation, attribute)]
            seen[index] = (c, relation, attribute)
    assert len(seen) == 38
    if layout in ("sparse38", "sparse45"):
        assert sorted(seen) == list(range(38))
    else:
        assert set(range(40)) - set(seen) == {10, 32}  # (Arithmetic, Type) of each component


def test_sparse38_matches_the_documented_table():
    # The layout documented in rpm_lib.rules: j = 5*rule + attr, j = 12 dropped, index = 19*c + j'.
    documented = {
        0: (0, "Constant", "Number"), 1: (0, "Constant", "Position"), 9: (0, "Progression", "Color"),
        11: (0, "Arithmetic", "Position"), 12: (0, "Arithmetic", "Size"), 18: (0, "Distribute_Three", "Color"),
        19: (1, "Constant", "Number"), 31: (1, "Arithmetic", "Size"), 37: (1, "Distribute_Three", "Color"),
    }
    for index, rule in documented.items():
        vec = np.zeros(38)
        vec[index] = 1
        assert rules.decode_raven_sparse_rules(vec, "sparse38") == [rule]


def test_sparse40_matches_the_official_layout():
    # mikomel/mlcl: component 0 index = 4*attr + rule; component 1 index = 20 + 5*rule + attr.
    documented = {4 * 3 + 1: (0, "Progression", "Size"), 20 + 5 * 3 + 4: (1, "Distribute_Three", "Color"),
                  4 * 1 + 2: (0, "Arithmetic", "Position"), 20 + 5 * 2 + 0: (1, "Arithmetic", "Number")}
    for index, rule in documented.items():
        vec = np.zeros(40)
        vec[index] = 1
        assert rules.decode_raven_sparse_rules(vec, "sparse40") == [rule]


# ------------------------------------------------------------------------------------------------
# reference files
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("configuration", rules.CONFIGURATIONS)
@pytest.mark.parametrize("dataset", ["I-RAVEN", "RAVEN"])
def test_encodings_agree_with_the_xml_rules(dataset, configuration, request):
    root = request.getfixturevalue("iraven_reference" if dataset == "I-RAVEN" else "raven_reference")
    pairs = list(reference_pairs(root, configuration))
    assert len(pairs) == 10
    matrices = []
    for npz, xml in pairs:
        data = np.load(npz)
        meta_matrix, expected = data["meta_matrix"], xml_rules(xml)
        assert set(rules.raven_rules_from_meta_matrix(meta_matrix)) == expected
        assert len(rules.raven_rules_from_meta_matrix(meta_matrix)) == len(expected)
        for layout in ("sparse38", "sparse40"):
            sparse = rules.raven_sparse(meta_matrix, layout)
            assert sparse.dtype == np.float32 and sparse.shape == (rules.RAVEN_SPARSE_DIMS[layout],)
            assert set(rules.decode_raven_sparse_rules(sparse, layout)) == expected
            constant_np = sum(1 for _c, r, a in expected if a == rules.NUMBER_POSITION)
            assert sparse.sum() == len(expected) + constant_np  # Constant N/P sets two bits
            assert sorted(rules.decode_raven_sparse(sparse, layout)) == sorted(
                f"component {c}: {r} on {a}" for c, r, a in expected
            )
        dense = rules.raven_dense(meta_matrix)
        assert dense.dtype == np.float32 and np.array_equal(dense, data["meta_target"].astype(np.float32))
        on_position = any(r in ("Progression", "Arithmetic") and a == "Position" for _c, r, a in expected)
        assert rules.requires_position_preserving(meta_matrix) == on_position
        names = xml_component_names(xml)
        lines = rules.describe_raven_rules(meta_matrix, configuration)
        assert sorted(lines) == sorted(f"{names[c]}: {r} on {a}" for c, r, a in expected)
        assert rules.describe_raven_rules(meta_matrix, rules.SHORT_NAMES[configuration]) == lines
        matrices.append(meta_matrix)
    for layout in ("sparse38", "sparse40"):
        batch = rules.raven_sparse_batch(np.stack(matrices), layout)
        assert np.array_equal(batch, np.stack([rules.raven_sparse(m, layout) for m in matrices]))


def test_describe_rejects_a_configuration_with_other_components(iraven_reference):
    two_components = np.load(iraven_reference / "in_center_single_out_center_single" / "RAVEN_0_train.npz")["meta_matrix"]
    with pytest.raises(ValueError, match="component"):
        rules.describe_raven_rules(two_components, "center_single")
    with pytest.raises(ValueError, match="unknown RAVEN configuration"):
        rules.describe_raven_rules(two_components, "Centre")


# ------------------------------------------------------------------------------------------------
# synthetic rule sets, decoding of predictions, malformed input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["sparse38", "sparse40", "sparse45"])
def test_random_rule_sets_round_trip(layout):
    rng = np.random.default_rng(0)
    matrices = [random_meta_matrix(rng, components=1 + i % 2) for i in range(300)]
    for matrix in matrices:
        expected = rules.raven_rules_from_meta_matrix(matrix)
        assert set(rules.decode_raven_sparse_rules(rules.raven_sparse(matrix, layout), layout)) == set(expected)
    batch = rules.raven_sparse_batch(np.stack(matrices), layout)
    assert np.array_equal(batch, np.stack([rules.raven_sparse(m, layout) for m in matrices]))


def test_decoding_predictions_uses_the_threshold_and_keeps_single_constant_bits():
    probabilities = np.full(38, 0.1)
    probabilities[[0, 8, 19 + 5]] = [0.9, 0.7, 0.55]  # Constant Number alone, Progression Size, c1 Progression Number
    assert rules.decode_raven_sparse(probabilities) == [
        "component 0: Constant on Number",
        "component 0: Progression on Size",
        "component 1: Progression on Number",
    ]
    assert rules.decode_raven_sparse(probabilities, threshold=0.6) == [
        "component 0: Constant on Number",
        "component 0: Progression on Size",
    ]
    assert rules.decode_raven_dense([1, 0, 0, 1, 0, 1, 1, 0, 0]) == ["Constant", "Distribute_Three", "Position", "Type"]
    with pytest.raises(ValueError, match="shape"):
        rules.decode_raven_sparse(np.zeros(40), "sparse38")
    with pytest.raises(ValueError, match="layout"):
        rules.raven_sparse(np.zeros((8, 9)), "sparse39")


def _valid_matrix() -> np.ndarray:
    return random_meta_matrix(np.random.default_rng(1), components=1)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.__setitem__((1, slice(0, 4)), np.array([1, 1, 0, 0])), "relation bit"),
        (lambda m: m.__setitem__((1, slice(0, 4)), 0), "relation bit"),
        (lambda m: m.__setitem__(slice(0, 4), 0), "all zero"),
        (lambda m: m.__setitem__((1, slice(None)), np.array([0, 0, 1, 0, 0, 0, 1, 0, 0])), "Arithmetic on Type"),
        (lambda m: m.__setitem__((0, slice(None)), np.array([1, 0, 0, 0, 1, 0, 0, 0, 0])), "Number/Position"),
        (lambda m: m.__setitem__((2, slice(4, 9)), np.array([0, 0, 0, 0, 1])), "Size"),
        (lambda m: m.__setitem__((3, 8), 2), "0 or 1"),
    ],
)
def test_malformed_meta_matrix_raises(edit, message):
    matrix = _valid_matrix().astype(np.int64)
    edit(matrix)
    with pytest.raises(ValueError, match=message):
        rules.raven_rules_from_meta_matrix(matrix)


def test_wrong_shape_raises():
    with pytest.raises(ValueError, match="shape"):
        rules.raven_rules_from_meta_matrix(np.zeros((4, 9)))
    with pytest.raises(ValueError, match="shape"):
        rules.raven_dense(np.zeros((8, 12)))


# ------------------------------------------------------------------------------------------------
# PGM
# ------------------------------------------------------------------------------------------------


def pgm_structure(triples: list[tuple[str, str, str]]) -> np.ndarray:
    out = np.zeros((4, 12), dtype=np.int64)
    for i, (o, a, r) in enumerate(triples):
        out[i, rules.PGM_OBJECTS.index(o)] = 1
        out[i, 2 + rules.PGM_ATTRIBUTES.index(a)] = 1
        out[i, 7 + rules.PGM_RELATIONS.index(r)] = 1
    return out


def test_pgm_vocabulary():
    assert len(rules.PGM_REGIMES) == 8 and "neutral" in rules.PGM_REGIMES
    assert rules.PGM_META_TARGET_FORMAT == (
        "shape", "line", "color", "number", "position", "size", "type",
        "progression", "XOR", "OR", "AND", "consistent_union",
    )


def test_pgm_dense_reproduces_the_papers_example():
    # Supplementary material: {[OR, shape, type], [AND, line, color]} -> 111000100110.
    structure = pgm_structure([("shape", "type", "OR"), ("line", "color", "AND")])
    assert "".join(str(int(v)) for v in rules.pgm_dense(structure)) == "111000100110"
    assert rules.decode_pgm_dense(rules.pgm_dense(structure)) == ["shape", "line", "color", "type", "OR", "AND"]


def test_pgm_sparse_round_trips_every_triple():
    indices = set()
    for o in rules.PGM_OBJECTS:
        for a in rules.PGM_ATTRIBUTES:
            for r in rules.PGM_RELATIONS:
                structure = pgm_structure([(o, a, r)])
                sparse = rules.pgm_sparse(structure)
                assert sparse.shape == (50,) and sparse.sum() == 1
                indices.add(int(np.flatnonzero(sparse)[0]))
                assert rules.decode_pgm_sparse_triples(sparse) == [(o, a, r)]
                assert rules.pgm_triples(structure) == [(o, a, r)]
    assert indices == set(range(50))
    # Official layout: index = 25*object + 5*(attribute) + relation, e.g. line/type/consistent_union = 49.
    assert rules.pgm_sparse_index("line", "type", "consistent_union") == 49
    assert rules.pgm_sparse_index("shape", "position", "AND") == 2 * 5 + 3
    assert rules.decode_pgm_sparse(rules.pgm_sparse(pgm_structure([("shape", "position", "AND")]))) == ["AND on shape position"]


def test_pgm_batch_matches_single_and_position_rule():
    rng = np.random.default_rng(3)
    structures = []
    for _ in range(50):
        n = int(rng.integers(1, 5))
        structures.append(pgm_structure([
            (rules.PGM_OBJECTS[rng.integers(2)], rules.PGM_ATTRIBUTES[rng.integers(5)], rules.PGM_RELATIONS[rng.integers(5)])
            for _ in range(n)
        ]))
    batch = rules.pgm_sparse_batch(np.stack(structures))
    assert np.array_equal(batch, np.stack([rules.pgm_sparse(s) for s in structures]))
    assert rules.requires_position_preserving(pgm_structure([("shape", "position", "progression")]))
    assert not rules.requires_position_preserving(pgm_structure([("shape", "position", "OR"), ("shape", "size", "progression")]))


@pytest.mark.parametrize(
    "row, message",
    [
        ([1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0], "exactly one object"),
        ([1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], "exactly one object"),
        ([1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 3], "0 or 1"),
    ],
)
def test_pgm_malformed_rows_raise(row, message):
    structure = np.zeros((4, 12), dtype=np.int64)
    structure[1] = row
    with pytest.raises(ValueError, match=message):
        rules.pgm_triples(structure)
    with pytest.raises(ValueError, match="no rule"):
        rules.pgm_triples(np.zeros((4, 12)))


# ------------------------------------------------------------------------------------------------
# The Mesh of I-RAVEN-Mesh (meta_matrix rows 8-11)
# ------------------------------------------------------------------------------------------------

MESH_GROUP0 = [("Constant", ("Number", "Position"))] + [
    (r, (a,)) for r in rules.RELATIONS[1:] for a in ("Number", "Position")
]


def with_mesh(matrix: np.ndarray, relation: str, attributes: tuple[str, ...]) -> np.ndarray:
    """(12, 9): ``matrix``'s 8 rows, then a Mesh with ``relation`` on ``attributes`` and Constant Type/Size/Color."""
    out = np.zeros((12, 9), dtype=np.uint8)
    out[:8] = matrix
    out[8, rules.RELATIONS.index(relation)] = 1
    for a in attributes:
        out[8, 4 + rules.ATTRIBUTES.index(a)] = 1
    for g, attribute in enumerate(("Type", "Size", "Color"), start=1):
        out[8 + g, 0] = 1
        out[8 + g, 4 + rules.ATTRIBUTES.index(attribute)] = 1
    return out


def test_mesh_vocabulary():
    assert rules.MESH_COMPONENT == 2 and rules.MESH_NAME == "Mesh"
    assert (rules.META_ROWS, rules.MESH_META_ROWS) == (8, 12)
    assert len(rules.MESH_SLOT_RULES) == 7 == len(set(rules.MESH_SLOT_RULES))
    assert rules.MESH_SLOT_RULES[0] == ("Constant", rules.NUMBER_POSITION)
    assert rules.component_names("Center", mesh=True) == {0: "Grid", 2: "Mesh"}
    assert rules.component_names("O-IG") == {0: "Out", 1: "In"}
    # figures that mix configurations number the shape components only: the Mesh names itself everywhere
    assert rules.component_legend() == "component 0: Grid, Left, Up or Out; component 1: Right, Down or In"


def test_each_mesh_rule_has_one_sparse45_slot_and_round_trips():
    base = _valid_matrix()
    for i, (relation, attributes) in enumerate(MESH_GROUP0):
        matrix = with_mesh(base, relation, attributes)
        attribute = rules.NUMBER_POSITION if len(attributes) == 2 else attributes[0]
        assert rules.has_mesh(matrix) and not rules.has_mesh(matrix[:8])
        decoded = rules.raven_rules_from_meta_matrix(matrix)
        assert decoded[-4:] == [(2, relation, attribute), (2, "Constant", "Type"), (2, "Constant", "Size"),
                                (2, "Constant", "Color")]
        sparse = rules.raven_sparse(matrix, "sparse45")
        assert np.flatnonzero(sparse[38:]).tolist() == [rules.MESH_SLOT_RULES.index((relation, attribute))]
        assert np.array_equal(sparse[:38], rules.raven_sparse(base, "sparse38"))
        assert rules.decode_raven_sparse_rules(sparse, "sparse45")[-1] == (2, relation, attribute)
        assert rules.decode_raven_sparse(sparse, "sparse45")[-1] == f"Mesh: {relation} on {attribute}"
        assert np.array_equal(rules.raven_sparse_batch(matrix[None], "sparse45")[0], sparse)
        # the two-component layouts leave the Mesh out, explicitly (module docstring)
        for layout in ("sparse38", "sparse40"):
            assert np.array_equal(rules.raven_sparse(matrix, layout), rules.raven_sparse(base, layout))
            assert np.array_equal(rules.raven_sparse_batch(matrix[None], layout)[0], rules.raven_sparse(base, layout))
        # dense-9 is the OR of all 12 rows (the file's meta_target)
        assert np.array_equal(rules.raven_dense(matrix), matrix.max(axis=0).astype(np.float32))
        assert i == 0 or rules.raven_dense(matrix)[rules.RELATIONS.index(relation)] == 1


def test_a_twelve_row_matrix_without_mesh_means_its_eight_rows():
    matrix = _valid_matrix()
    padded = np.zeros((12, 9), dtype=np.uint8)
    padded[:8] = matrix
    assert rules.raven_rules_from_meta_matrix(padded) == rules.raven_rules_from_meta_matrix(matrix)
    for layout in rules.RAVEN_SPARSE_DIMS:
        assert np.array_equal(rules.raven_sparse(padded, layout), rules.raven_sparse(matrix, layout))
    assert not rules.raven_sparse(padded, "sparse45")[38:].any()
    assert rules.describe_raven_rules(padded, "Center") == rules.describe_raven_rules(matrix, "Center")


def test_random_mesh_rule_sets_batch_equals_single():
    rng = np.random.default_rng(7)
    matrices = []
    for i in range(200):
        relation, attributes = MESH_GROUP0[rng.integers(len(MESH_GROUP0))]
        matrix = with_mesh(random_meta_matrix(rng, components=1 + i % 2), relation, attributes)
        matrices.append(matrix if i % 5 else np.pad(matrix[:8], ((0, 4), (0, 0))))  # some without a Mesh
    for layout in rules.RAVEN_SPARSE_DIMS:
        batch = rules.raven_sparse_batch(np.stack(matrices), layout)
        assert np.array_equal(batch, np.stack([rules.raven_sparse(m, layout) for m in matrices])), layout
        for m, vector in zip(matrices, batch):
            expected = {r for r in rules.raven_rules_from_meta_matrix(m)
                        if r[0] != 2 or (layout == "sparse45" and r[1:] in rules.MESH_SLOT_RULES)}
            assert set(rules.decode_raven_sparse_rules(vector, layout)) == expected


def test_describe_names_the_mesh_in_every_configuration():
    for configuration, names in rules.COMPONENT_NAMES.items():
        rng = np.random.default_rng(len(names))
        matrix = with_mesh(random_meta_matrix(rng, components=len(names)), "Progression", ("Position",))
        lines = rules.describe_raven_rules(matrix, configuration)
        assert lines[-4:] == ["Mesh: Progression on Position", "Mesh: Constant on Type", "Mesh: Constant on Size",
                              "Mesh: Constant on Color"]
        assert {line.split(":")[0] for line in lines[:-4]} == set(names)
        assert rules.describe_raven_rules(matrix)[-4] == "Mesh: Progression on Position"
    assert rules.format_raven_rule((2, "Arithmetic", "Number")) == "Mesh: Arithmetic on Number"


def test_a_mesh_position_rule_needs_position_preserving_augmentation():
    base = _valid_matrix()  # component 0 without a rule on Position
    base[0] = 0
    base[0, [0, 4, 5]] = 1
    assert not rules.requires_position_preserving(base)
    assert rules.requires_position_preserving(with_mesh(base, "Progression", ("Position",)))
    assert rules.requires_position_preserving(with_mesh(base, "Arithmetic", ("Position",)))
    assert not rules.requires_position_preserving(with_mesh(base, "Progression", ("Number",)))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.__setitem__((9, slice(0, 4)), np.array([0, 1, 0, 0])), "Mesh's Type is always Constant"),
        (lambda m: m.__setitem__((11, slice(0, 4)), np.array([0, 0, 0, 1])), "Mesh's Color is always Constant"),
        (lambda m: m.__setitem__((8, slice(None)), 0), "relation bit"),
        (lambda m: m.__setitem__((8, 5), 0), "Number/Position"),
    ],
)
def test_malformed_mesh_rows_raise(edit, message):
    matrix = with_mesh(_valid_matrix(), "Constant", ("Number", "Position")).astype(np.int64)
    edit(matrix)
    with pytest.raises(ValueError, match=message):
        rules.raven_rules_from_meta_matrix(matrix)
    with pytest.raises(ValueError, match=message):
        rules.raven_sparse(matrix, "sparse45")


def test_other_row_counts_raise():
    for rows in (4, 10, 16):
        with pytest.raises(ValueError, match=r"expected shape \(8, 9\) or \(12, 9\)"):
            rules.raven_rules_from_meta_matrix(np.zeros((rows, 9)))
        with pytest.raises(ValueError, match=r"expected shape \(N, 8, 9\) or \(N, 12, 9\)"):
            rules.raven_sparse_batch(np.zeros((2, rows, 9)), "sparse45")
