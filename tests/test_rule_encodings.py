"""rpm_lib.rule_encodings: one test over every registered encoding, plus the naming and validation rules."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib import rules
from rpm_lib.rule_encodings import ENCODING_NAMES, default_sparse, encodings_for, rule_encoding
from meta_matrices import CENTER, LEFT_RIGHT


def with_mesh(matrix: np.ndarray, relation: str, attribute: str) -> np.ndarray:
    """(12, 9): ``matrix`` plus an I-RAVEN-Mesh Mesh (rows 8-11) with ``relation`` on ``attribute``."""
    out = np.zeros((12, 9), dtype=np.uint8)
    out[:8] = matrix
    out[8, rules.RELATIONS.index(relation)] = 1
    for a in ("Number", "Position") if attribute == "Number/Position" else (attribute,):
        out[8, 4 + rules.ATTRIBUTES.index(a)] = 1
    for row, a in ((9, "Type"), (10, "Size"), (11, "Color")):
        out[row, [0, 4 + rules.ATTRIBUTES.index(a)]] = 1
    return out


PGM = np.array([[1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0],    # shape size progression
                [0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0],    # line color XOR
                [0] * 12, [0] * 12], dtype=np.uint8)

EVERY = [(dataset, name) for dataset in ("iraven", "pgm") for name in encodings_for(dataset)]
WIDTHS = {("iraven", "dense"): 9, ("iraven", "sparse38"): 38, ("iraven", "sparse40"): 40, ("iraven", "sparse45"): 45,
          ("pgm", "dense"): 12, ("pgm", "sparse50"): 50}


@pytest.mark.parametrize(("dataset", "name"), EVERY)
def test_every_encoding_encodes_decodes_and_names_its_slots(dataset: str, name: str) -> None:
    encoding = rule_encoding(name, dataset)
    assert encoding.width == WIDTHS[(dataset, name)]
    labels = np.stack([CENTER, LEFT_RIGHT]) if dataset == "iraven" else PGM[None]
    vectors = encoding.encode_batch(labels)
    assert vectors.shape == (len(labels), encoding.width) and vectors.dtype == np.float32
    names = encoding.slot_names()
    assert len(names) == encoding.width and len(set(names)) == encoding.width, "one unique name per slot"
    for vector in vectors:
        # decoding a label gives the names of its active slots (the joint Constant on Number/Position aside)
        decoded = encoding.decode(vector)
        active = [names[j] for j in np.flatnonzero(vector)]
        assert decoded and set(decoded) <= set(active) | {w for w in decoded if "Number/Position" in w}
        assert encoding.decode(vector * 0.4) == [], "probabilities under the threshold are off"
    assert encoding.sample_key == ("rules_dense" if name == "dense" else "rules_sparse")


def test_raven_sparse_slots_are_named_by_component_and_configuration() -> None:
    encoding = rule_encoding("sparse38", "iraven")
    vector = encoding.encode_batch(LEFT_RIGHT[None])[0]
    shown = {encoding.slot_names()[j] for j in np.flatnonzero(vector)}
    assert {"component 1: Progression on Type", "component 0: Constant on Number",
            "component 0: Constant on Position"} <= shown
    named = encoding.slot_names("left_center_single_right_center_single")
    assert named[19 + rules.RAVEN_RULE_PAIRS.index(("Progression", "Type"))] == "Right: Progression on Type"
    assert "Right: Progression on Type" in encoding.decode(vector, configuration="L-R")
    assert "component 1: Progression on Type" in encoding.decode(vector)
    # a one-component configuration says so for component 1's slots, which only a prediction can fill
    assert encoding.slot_names("center_single")[19].startswith("component 1 (not in Center): ")
    assert "Grid: Progression on Type" in encoding.decode(encoding.encode_batch(CENTER[None])[0], configuration="Center")


def test_sparse40_and_sparse50_names() -> None:
    sparse40 = rule_encoding("sparse40", "iraven").slot_names()
    assert sparse40[10] == "component 0: Arithmetic on Type"  # the official layout keeps a slot no rule uses
    sparse50 = rule_encoding("sparse50", "pgm").slot_names()
    assert sparse50[rules.pgm_sparse_index("line", "color", "XOR")] == "XOR on line color"
    assert rule_encoding("dense", "iraven").slot_names() == list(rules.META_TARGET_FORMAT)
    assert rule_encoding("dense", "pgm").slot_names() == list(rules.PGM_META_TARGET_FORMAT)


def test_decode_in_words_and_thresholds() -> None:
    encoding = rule_encoding("sparse38", "iraven")
    vector = encoding.encode_batch(CENTER[None])[0]
    words = encoding.decode(vector)
    assert "component 0: Progression on Type" in words and "component 0: Constant on Number/Position" in words
    probabilities = vector * 0.9
    probabilities[rules.RAVEN_RULE_PAIRS.index(("Constant", "Color"))] = 0.7
    assert set(encoding.decode(probabilities, 0.5)) - set(words) == {"component 0: Constant on Color"}
    assert rule_encoding("dense", "iraven").decode(rules.raven_dense(CENTER)) == list(rules.META_TARGET_FORMAT)


@pytest.mark.parametrize(("name", "dataset"), [("sparse50", "iraven"), ("sparse38", "pgm"), ("sparse99", "iraven")])
def test_an_encoding_of_another_dataset_is_refused_with_the_valid_ones(name: str, dataset: str) -> None:
    with pytest.raises(ValueError, match=f"{name}.*use one of"):
        rule_encoding(name, dataset)
    with pytest.raises(ValueError, match="unknown dataset"):
        rule_encoding("dense", "mnist")


def test_config_choices_come_from_the_registry() -> None:
    from rpm_lib.training.config import RULE_ENCODINGS, ConfigError, TrainConfig

    assert RULE_ENCODINGS == ("auto", *ENCODING_NAMES)
    assert TrainConfig(setup="ce_aux_sparse").rule_spec.width == 38
    assert TrainConfig(setup="ce_aux_dense").rule_spec.sample_key == "rules_dense"
    with pytest.raises(ConfigError, match="'rule_encoding'.*sparse50.*use one of dense, sparse38, sparse40"):
        TrainConfig(setup="ce_aux_sparse", rule_encoding="sparse50")


@pytest.mark.parametrize(("dataset", "name"), EVERY)
def test_an_encoding_pickles_as_the_registry_entry(dataset: str, name: str) -> None:
    import pickle

    encoding = rule_encoding(name, dataset)
    assert pickle.loads(pickle.dumps(encoding)) is encoding


# ------------------------------------------------------------------------------------------------
# I-RAVEN-Mesh: sparse45 covers the Mesh; what the others do with it is explicit
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("relation, attribute", rules.MESH_SLOT_RULES)
@pytest.mark.parametrize("base, configuration", [(CENTER, "Center"), (LEFT_RIGHT, "L-R")])
def test_sparse45_round_trips_a_mesh_problem_to_words(base, configuration, relation, attribute):
    encoding = rule_encoding("sparse45", "iraven")
    matrix = with_mesh(base, relation, attribute)
    vector = encoding.encode_batch(matrix[None])[0]
    assert vector.shape == (45,) and vector[38:].sum() == 1
    words = encoding.decode(vector, configuration=configuration)
    # every rule in words, except the Mesh's Type/Size/Color, which are Constant in every problem (no slot)
    expected = [w for w in rules.describe_raven_rules(matrix, configuration)
                if w not in ("Mesh: Constant on Type", "Mesh: Constant on Size", "Mesh: Constant on Color")]
    assert sorted(words) == sorted(expected)
    assert f"Mesh: {relation} on {attribute}" in words
    # and the slot names say the same: the active slots of the label are the decoded rules
    names = encoding.slot_names(configuration)
    active = {names[j] for j in np.flatnonzero(vector)}
    assert f"Mesh: {relation} on {attribute}" in active and set(words) <= active | {
        w for w in words if w.endswith("Number/Position")}


def test_sparse45_slot_names_and_a_problem_without_mesh():
    encoding = rule_encoding("sparse45", "iraven")
    names = encoding.slot_names()
    assert names[:38] == rule_encoding("sparse38", "iraven").slot_names()
    assert names[38:] == ["Mesh: Constant on Number/Position", "Mesh: Progression on Number",
                          "Mesh: Progression on Position", "Mesh: Arithmetic on Number",
                          "Mesh: Arithmetic on Position", "Mesh: Distribute_Three on Number",
                          "Mesh: Distribute_Three on Position"]
    assert encoding.slot_names("Center")[40] == "Mesh: Progression on Position"  # not "component 2 (not in Center)"
    plain = encoding.encode_batch(np.stack([CENTER, LEFT_RIGHT]))
    assert not plain[:, 38:].any(), "no mesh: all 7 Mesh slots off"
    assert np.array_equal(plain[:, :38], rule_encoding("sparse38", "iraven").encode_batch(np.stack([CENTER, LEFT_RIGHT])))


def test_what_each_raven_encoding_does_with_a_mesh_problem():
    matrix = with_mesh(LEFT_RIGHT, "Arithmetic", "Position")  # L-R alone has no Arithmetic anywhere
    covers = {name: rule_encoding(name, "iraven").covers_mesh for name in encodings_for("iraven")}
    assert covers == {"dense": True, "sparse38": False, "sparse40": False, "sparse45": True}
    for name in ("sparse38", "sparse40"):  # the shape components only, as the reference training code
        encoding = rule_encoding(name, "iraven")
        assert np.array_equal(encoding.encode_batch(matrix[None]), encoding.encode_batch(LEFT_RIGHT[None]))
        assert "a Mesh is left out" in encoding.description
    dense = rule_encoding("dense", "iraven").encode_batch(matrix[None])[0]
    assert np.array_equal(dense, matrix.max(axis=0).astype(np.float32))  # = the file's meta_target
    arithmetic = rules.RELATIONS.index("Arithmetic")
    assert dense[arithmetic] == 1 and rules.raven_dense(LEFT_RIGHT)[arithmetic] == 0
    assert default_sparse("iraven") == "sparse38" and default_sparse("iraven", mesh=True) == "sparse45"
    assert default_sparse("pgm", mesh=True) == "sparse50"
