"""rpm_lib.rule_encodings: one test over every registered encoding, plus the naming and validation rules."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib import rules
from rpm_lib.rule_encodings import ENCODING_NAMES, encodings_for, rule_encoding
from meta_matrices import CENTER, LEFT_RIGHT


PGM = np.array([[1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0],    # shape size progression
                [0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0],    # line color XOR
                [0] * 12, [0] * 12], dtype=np.uint8)

EVERY = [(dataset, name) for dataset in ("iraven", "pgm") for name in encodings_for(dataset)]
WIDTHS = {("iraven", "dense"): 9, ("iraven", "sparse38"): 38, ("iraven", "sparse40"): 40,
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
