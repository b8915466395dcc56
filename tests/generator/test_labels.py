"""Label arrays (meta_matrix, meta_target, structure, meta_structure) from a Problem."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib.generator import labels
from rpm_lib.generator.constants import CONFIG_SPECS, META_STRUCTURE_FORMAT
from rpm_lib.generator.problem import Rule
from rpm_lib.generator.xml_io import read_problem_xml


@pytest.mark.parametrize("dataset", ["I-RAVEN", "RAVEN"])
def test_labels_from_the_reference_xml_equal_the_stored_npz_labels(dataset, request):
    root = request.getfixturevalue("iraven_reference" if dataset == "I-RAVEN" else "raven_reference")
    paths = sorted(root.glob("*/RAVEN_*.xml"))
    assert len(paths) >= 7
    for path in paths:
        computed = labels.problem_labels(read_problem_xml(path))
        with np.load(path.with_suffix(".npz")) as stored:
            for key, value in computed.items():
                assert value.dtype == stored[key].dtype, (path, key)
                assert value.shape == stored[key].shape, (path, key)
                assert np.array_equal(value, stored[key]), (path, key)


def test_meta_matrix_rows_and_columns():
    rules = [
        Rule(0, "Constant", "Number/Position"), Rule(0, "Progression", "Type", 1),
        Rule(0, "Arithmetic", "Size", -1), Rule(0, "Distribute_Three", "Color"),
        Rule(1, "Arithmetic", "Position", 1), Rule(1, "Constant", "Type"),
        Rule(1, "Constant", "Size"), Rule(1, "Progression", "Color", -2),
    ]
    matrix = labels.meta_matrix(rules)
    assert matrix.dtype == np.uint8 and matrix.shape == (8, 9)
    assert matrix[0].tolist() == [1, 0, 0, 0, 1, 1, 0, 0, 0]
    assert matrix[1].tolist() == [0, 1, 0, 0, 0, 0, 1, 0, 0]
    assert matrix[2].tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0]
    assert matrix[3].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert matrix[4].tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert matrix[7].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert labels.meta_target(matrix).tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 1]
    # the same rules in another order give the same matrix
    assert np.array_equal(labels.meta_matrix(rules[::-1]), matrix)


def test_meta_matrix_rejects_two_rules_in_one_group_and_unknown_rules():
    with pytest.raises(ValueError, match="two rules"):
        labels.meta_matrix([Rule(0, "Constant", "Type"), Rule(0, "Progression", "Type", 1)])
    with pytest.raises(ValueError, match="unknown rule"):
        labels.meta_matrix([Rule(0, "XOR", "Type")])


def test_structure_serialisation_of_one_and_two_component_configurations():
    assert labels.structure_tokens("center_single") == (
        "Scene", "Singleton", "Grid", "Center_Single", "/", "/", "/", "/")
    assert labels.structure_tokens("in_distribute_four_out_center_single") == (
        "Scene", "Out_In", "Out", "Out_Center_Single", "/", "/", "In", "In_Distribute_Four", "/", "/", "/", "/")
    array = labels.structure("in_distribute_four_out_center_single")
    assert array.dtype == np.dtype("S18")
    for configuration, spec in CONFIG_SPECS.items():
        vector = labels.meta_structure(configuration)
        names = {META_STRUCTURE_FORMAT[i] for i in np.flatnonzero(vector)}
        assert names == {spec.structure} | {n for pair in spec.components for n in pair}


def test_problem_labels_checks_the_rule_count_against_the_configuration(iraven_reference):
    problem = read_problem_xml(iraven_reference / "center_single" / "RAVEN_0_train.xml")
    problem.rules = problem.rules[:3]
    with pytest.raises(ValueError, match="4 rules"):
        labels.problem_labels(problem)
