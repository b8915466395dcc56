"""The .xml writer reproduces the reference bytes; the reader rebuilds the Problem and reports bad files."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rpm_lib.generator.xml_io import XmlFormatError, parse_problem_xml, problem_xml, read_problem_xml


def _files(root: Path) -> list[Path]:
    files = sorted(root.glob("*/RAVEN_*.xml"))
    assert files
    return files


@pytest.mark.parametrize("dataset", ["I-RAVEN", "RAVEN"])
def test_reference_xml_round_trips_byte_for_byte(dataset, request):
    root = request.getfixturevalue("iraven_reference" if dataset == "I-RAVEN" else "raven_reference")
    for path in _files(root):
        problem = read_problem_xml(path)
        text = problem_xml(problem)
        assert text == path.read_text(), path
        assert parse_problem_xml(text, "rewritten", target=problem.target) == problem


def test_reader_fills_the_problem(iraven_reference, raven_reference):
    balanced = read_problem_xml(iraven_reference / "in_distribute_four_out_center_single" / "RAVEN_0_train.xml")
    assert balanced.configuration == "in_distribute_four_out_center_single"
    assert balanced.mode == "balanced" and len(balanced.modified) == 8
    assert balanced.modified[balanced.target] == []
    assert all(changes for i, changes in enumerate(balanced.modified) if i != balanced.target)
    assert len(balanced.context) == 8 and len(balanced.candidates) == 8
    assert [r.component for r in balanced.rules] == [0] * 4 + [1] * 4
    assert all(r.value == 0 for r in balanced.rules)
    assert {c.layout for p in balanced.panels for c in p.components} == {"Out_Center_Single", "In_Distribute_Four"}
    original = read_problem_xml(raven_reference / "distribute_nine" / "RAVEN_3_train.xml")  # target from the .npz
    assert original.mode == "original" and original.modified is None
    import numpy as np

    assert original.target == int(np.load(raven_reference / "distribute_nine" / "RAVEN_3_train.npz")["target"])


def test_original_xml_without_npz_needs_a_target(raven_reference, tmp_path):
    copy = tmp_path / "RAVEN_0_train.xml"
    copy.write_bytes((raven_reference / "center_single" / "RAVEN_0_train.xml").read_bytes())
    with pytest.raises(XmlFormatError, match="pass target"):
        read_problem_xml(copy)
    assert read_problem_xml(copy, target=5).target == 5


def test_balanced_xml_target_must_agree(iraven_reference):
    path = iraven_reference / "center_single" / "RAVEN_0_train.xml"
    problem = read_problem_xml(path)
    with pytest.raises(XmlFormatError, match="unmodified"):
        read_problem_xml(path, target=(problem.target + 1) % 8)


def test_bad_files_raise_errors_naming_the_file_and_the_problem(iraven_reference, tmp_path):
    text = (iraven_reference / "center_single" / "RAVEN_0_train.xml").read_text()
    cases = {
        "truncated": (text[: len(text) // 2], "not well-formed"),
        "number": (text.replace('Layout Number="0"', 'Layout Number="2"', 1), "Number=2 but 1 entities"),
        "bbox": (text.replace('bbox="[0.5, 0.5, 1, 1]"', 'bbox="[0.3, 0.5, 1, 1]"', 1), "not a slot"),
        "rule": (text.replace('name="Progression"', 'name="XOR"', 1), "unknown rule"),
        "level": (text.replace('Type="', 'Type="x', 1), "not an integer"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.xml"
        path.write_text(content)
        with pytest.raises(XmlFormatError, match=message) as error:
            read_problem_xml(path)
        assert str(path) in str(error.value)
    with pytest.raises(XmlFormatError, match="cannot read"):
        read_problem_xml(tmp_path / "missing.xml")


def test_writer_writes_rules_in_group_order_and_modified_attributes(iraven_reference):
    problem = read_problem_xml(iraven_reference / "distribute_four" / "RAVEN_1_train.xml")
    shuffled = dataclasses.replace(problem, rules=problem.rules[::-1])
    assert problem_xml(shuffled) == problem_xml(problem)
    original = dataclasses.replace(problem, modified=None, mode="original")
    assert "<Modified_attributes>" in problem_xml(problem)
    assert "<Modified_attributes>" not in problem_xml(original)
