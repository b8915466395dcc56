"""Validity checker: exactly one candidate (the target) satisfies all rules -- generated and reference problems."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.generator import render, xml_io
from rpm_lib.generator.api import generate_problem, generate_problems, problem_rng
from rpm_lib.generator.problem import Problem, Rule
from rpm_lib.generator.validity import (
    check_candidate,
    check_context,
    explain,
    infer_rules,
    satisfying_candidates,
)
from rpm_lib.rules import CONFIGURATIONS

PER_CONFIGURATION = 2000


def panel_key(panel) -> tuple:
    """Attribute-level identity of a panel: per component, the set of (slot, type, size, color, angle)."""
    return tuple(
        frozenset((s, e.type, e.size, e.color, e.angle) for s, e in zip(comp.slots, comp.entities))
        for comp in panel.components
    )


@pytest.mark.parametrize("mode", ["balanced", "original"])
@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_target_is_the_only_satisfying_candidate(configuration: str, mode: str) -> None:
    for p in generate_problems(configuration, PER_CONFIGURATION, seed=31, mode=mode):
        assert all(check.satisfied for check in check_context(p)), explain(p, p.target)
        assert satisfying_candidates(p) == [p.target], explain(p)
        assert len({panel_key(c) for c in p.candidates}) == 8


def find(configuration: str, mode: str, predicate, limit: int = 5000) -> Problem:
    for p in generate_problems(configuration, limit, seed=32, mode=mode):
        if predicate(p):
            return p
    raise AssertionError("no generated problem matched the predicate")


def test_free_constant_is_not_a_constraint_but_visible_one_is() -> None:
    """Constant Type where entities are resampled (non-uniform, N/P rule on Number) constrains nothing;
    Constant Type with carried entities (Constant N/P) does."""

    def with_rules(np_name: str, np_attr: str, uniform: bool):
        def predicate(p: Problem) -> bool:
            comp = p.answer.components[0]
            return (p.rules[0].name == np_name and p.rules[0].attr == np_attr and p.rules[1].name == "Constant"
                    and (comp.uniformity == 3) == uniform and len(comp.entities) >= 2)
        return predicate

    free = find("distribute_nine", "balanced", with_rules("Progression", "Number", False))
    answer = free.answer.components[0]
    answer.entities[0].type = 1 + answer.entities[0].type % 5  # break the "constant" Type of one entity
    assert satisfying_candidates(free) == [free.target]

    carried = find("distribute_nine", "balanced", with_rules("Constant", "Number/Position", False))
    answer = carried.answer.components[0]
    answer.entities[0].type = 1 + answer.entities[0].type % 5
    assert satisfying_candidates(carried) == []
    failed = [ch for ch in check_candidate(carried, carried.target) if not ch.satisfied]
    assert [(ch.rule.name, ch.rule.attr) for ch in failed] == [("Constant", "Type")]


def test_parameters_are_inferred_without_rule_values() -> None:
    p = find("distribute_four", "original", lambda p: p.rules[0].name in ("Progression", "Arithmetic")
             and p.rules[2].name in ("Progression", "Arithmetic"))
    stripped = dataclasses.replace(p, rules=[dataclasses.replace(r, value=0) for r in p.rules])
    inferred = infer_rules(stripped)
    size = inferred[2]
    assert size.parameter == p.rules[2].value
    if p.rules[0].attr == "Number" or p.rules[0].name == "Arithmetic":
        assert inferred[0].parameter == p.rules[0].value
    else:  # Progression-Position: the shift modulo the 4 slots
        assert inferred[0].parameter == p.rules[0].value % 4
    assert satisfying_candidates(stripped) == [p.target]


def test_wrong_rules_are_reported_as_context_errors() -> None:
    p = find("center_single", "balanced", lambda p: p.rules[3].name == "Progression")
    wrong = dataclasses.replace(p, rules=p.rules[:3] + [Rule(0, "Constant", "Color")])
    verdicts = check_context(wrong)
    assert [v.satisfied for v in verdicts] == [True, True, True, False]
    assert satisfying_candidates(wrong) == []
    report = explain(wrong)
    assert "ERROR" in report and "Constant Color" in report
    with pytest.raises(IndexError):
        check_candidate(p, 8)


def test_explain_names_every_rule_and_candidate() -> None:
    p = generate_problem("in_distribute_four_out_center_single", problem_rng(1, "in_distribute_four_out_center_single", 0))
    report = explain(p)
    assert report.count("candidate ") == 8
    for rule in p.rules:
        assert f"c{rule.component} {rule.name} {rule.attr}" in report
    assert "candidate {}: OK".format(p.target) in report


def _reference_problems(root: Path):
    files = sorted(root.glob("*/RAVEN_*.xml"))
    assert files, f"no .xml files under {root}"
    return [(f, xml_io.read_problem_xml(f)) for f in files]


def test_reference_iraven_target_is_unique(iraven_reference: Path) -> None:
    for path, problem in _reference_problems(iraven_reference):
        assert satisfying_candidates(problem) == [problem.target], f"{path}\n{explain(problem)}"


def test_reference_raven_target_is_unique(raven_reference: Path) -> None:
    for path, problem in _reference_problems(raven_reference):
        assert satisfying_candidates(problem) == [problem.target], f"{path}\n{explain(problem)}"


@pytest.mark.parametrize("mode", ["balanced", "original"])
def test_no_two_candidate_images_are_equal(mode: str) -> None:
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 60, seed=33, mode=mode):
            image = render.render_problem(p)
            assert image.shape == (16, 160, 160) and image.dtype == np.uint8
            flat = {image[8 + k].tobytes() for k in range(8)}
            assert len(flat) == 8, f"{configuration} problem {p.extra['index']}: two candidates look identical"


@pytest.mark.parametrize("mode", ["balanced", "original"])
def test_target_stays_unique_after_an_xml_round_trip(mode: str) -> None:
    """The .xml keeps no rule parameters; the checker must still single out the target from what it keeps."""
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 15, seed=34, mode=mode):
            parsed = xml_io.parse_problem_xml(xml_io.problem_xml(p), target=p.target)
            assert all(r.value == 0 for r in parsed.rules)
            assert parsed.modified == p.modified
            assert satisfying_candidates(parsed) == [p.target]
