"""Row generation (docs/generator.md, "Row generation"): ranges, entity copying/regeneration, consistency, and
the stateful quirks."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import binomtest

from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.problem import ComponentPanel, Rule
from rpm_lib.generator.rows import UNIFORM_LEVEL, generate_component_rows
from rpm_lib.generator.sampling import RandomStream, pruned_ranges, rule_table

ENTITY_ATTRS = ("type", "size", "color")
CONSTANT_ENTITY_RULES = [Rule(0, "Constant", a) for a in ("Type", "Size", "Color")]


def make_rows(layout: str, rules: list[Rule], stream: RandomStream) -> list[list[ComponentPanel]]:
    return generate_component_rows(rules, pruned_ranges(layout, rules), stream)


def many(layout: str, rules: list[Rule], count: int, seed: int) -> list[list[list[ComponentPanel]]]:
    stream = RandomStream(np.random.default_rng(seed))
    return [make_rows(layout, rules, stream) for _ in range(count)]


def levels(panel: ComponentPanel, attr: str) -> set[int]:
    return {getattr(e, attr) for e in panel.entities}


def full(entity) -> tuple[int, int, int, int]:
    return entity.type, entity.size, entity.color, entity.angle


@pytest.mark.parametrize("layout", ["Distribute_Nine", "In_Distribute_Four", "Out_Center_Single", "Center_Single"])
def test_every_rule_keeps_levels_in_range(layout: str) -> None:
    """For every feasible rule: first columns stay in the pruned start range, all panels in the layout range."""
    from rpm_lib.generator.constants import LAYOUTS

    spec = LAYOUTS[layout]
    stream = RandomStream(np.random.default_rng(1))
    for group in range(4):
        for option in rule_table(layout, group):
            rules = [Rule(0, "Constant", "Number/Position")] + list(CONSTANT_ENTITY_RULES)
            rules[group] = Rule(0, option.name, option.attr, option.value)
            field = ("number", "type", "size", "color")[group]
            for _ in range(40):
                rows = make_rows(layout, rules, stream)
                for r, row in enumerate(rows):
                    for col, panel in enumerate(row):
                        assert len(panel.slots) == len(panel.entities) == len(set(panel.slots))
                        assert all(0 <= s < len(spec.slots) for s in panel.slots)
                        lo, hi = spec.number
                        assert lo <= panel.number <= hi
                        for attr in ENTITY_ATTRS:
                            lo, hi = getattr(spec, attr)
                            assert all(lo <= v <= hi for v in levels(panel, attr)), (option, attr)
                    first = row[0]
                    lo, hi = option.start
                    values = {first.number} if group == 0 else levels(first, field)
                    assert all(lo <= v <= hi for v in values), (option, r, values)


def test_uniform_layouts_copy_one_entity_and_uniformity_is_one_in_four() -> None:
    rules = [Rule(0, "Progression", "Number", 1)] + list(CONSTANT_ENTITY_RULES)
    uniform = 0
    samples = many("Distribute_Nine", rules, 800, seed=2)
    for rows in samples:
        uniformity = rows[0][0].uniformity
        assert all(p.uniformity == uniformity for row in rows for p in row)
        if uniformity == UNIFORM_LEVEL:
            uniform += 1
            for row in rows:
                # entity regeneration under a Number rule copies the previous panel's first entity
                assert len({full(e) for p in row for e in p.entities}) == 1
    assert binomtest(uniform, len(samples), 0.25).pvalue > 1e-3


def test_non_uniform_number_rules_resample_entities() -> None:
    rules = [Rule(0, "Progression", "Number", 1)] + list(CONSTANT_ENTITY_RULES)
    varied = total = 0
    for rows in many("Distribute_Nine", rules, 300, seed=3):
        if rows[0][0].uniformity == UNIFORM_LEVEL:
            continue
        for row in rows:
            for panel in row[1:]:
                total += 1
                varied += len({e.angle for e in panel.entities}) > 1
    assert total > 0 and varied / total > 0.5


@pytest.mark.parametrize("np_rule", [Rule(0, "Constant", "Number/Position"), Rule(0, "Progression", "Position", -1)])
def test_carried_entities_keep_every_attribute(np_rule: Rule) -> None:
    rules = [np_rule] + list(CONSTANT_ENTITY_RULES)
    for rows in many("Distribute_Nine", rules, 200, seed=4):
        for row in rows:
            for a, b in zip(row, row[1:]):
                shifted = [(s + np_rule.value) % 9 for s in a.slots]
                assert b.slots == shifted
                assert [full(e) for e in a.entities] == [full(e) for e in b.entities]


def test_progression_enforces_consistency_in_non_uniform_layouts() -> None:
    rules = [Rule(0, "Constant", "Number/Position"), Rule(0, "Constant", "Type"), Rule(0, "Progression", "Size", 1),
             Rule(0, "Constant", "Color")]
    for rows in many("Distribute_Four", rules, 200, seed=5):
        for row in rows:
            sizes = [levels(p, "size") for p in row]
            assert all(len(s) == 1 for s in sizes)  # column 1 made consistent too
            (s1,), (s2,), (s3,) = sizes
            assert s2 - s1 == s3 - s2 == 1


@pytest.mark.parametrize(
    "layout, rule, key",
    [
        ("Distribute_Nine", Rule(0, "Distribute_Three", "Number"), lambda p: p.number),
        ("Distribute_Four", Rule(0, "Distribute_Three", "Position"), lambda p: frozenset(p.slots)),
        ("Center_Single", Rule(0, "Distribute_Three", "Type"), lambda p: p.entities[0].type),
        ("Distribute_Four", Rule(0, "Distribute_Three", "Color"), lambda p: p.entities[0].color),
    ],
)
def test_distribute_three_rows_are_cyclic_shifts_in_random_order(layout, rule, key) -> None:
    group = ("Number/Position", "Type", "Size", "Color").index(rule.attr) if rule.attr in ("Type", "Size", "Color") else 0
    rules = [Rule(0, "Constant", "Number/Position")] + list(CONSTANT_ENTITY_RULES)
    rules[group] = rule
    first_order = 0
    samples = many(layout, rules, 600, seed=6)
    for rows in samples:
        values = [[key(p) for p in row] for row in rows]
        a, b, c = values[0]
        assert len({a, b, c}) == 3
        if group > 0:  # all entities share the distributed level
            attr = rule.attr.lower()
            assert all(len(levels(p, attr)) == 1 for row in rows for p in row)
        assert {tuple(values[1]), tuple(values[2])} == {(b, c, a), (c, a, b)}
        first_order += tuple(values[1]) == (b, c, a)
    assert binomtest(first_order, len(samples), 0.5).pvalue > 1e-3


def test_distribute_three_position_moves_the_same_entities() -> None:
    rules = [Rule(0, "Distribute_Three", "Position")] + list(CONSTANT_ENTITY_RULES)
    for rows in many("Distribute_Nine", rules, 200, seed=7):
        count = rows[0][0].number
        for row in rows:
            assert all(p.number == count for p in row)
            assert [full(e) for e in row[0].entities] == [full(e) for e in row[2].entities]


@pytest.mark.parametrize("sign", [1, -1])
def test_arithmetic_position_acceptance_and_set_operation(sign: int) -> None:
    rules = [Rule(0, "Arithmetic", "Position", sign)] + list(CONSTANT_ENTITY_RULES)
    for rows in many("Distribute_Nine", rules, 300, seed=8):
        for p1, p2, p3 in rows:
            s1, s2, s3 = (frozenset(p.slots) for p in (p1, p2, p3))
            if sign > 0:
                assert not s2 <= s1 and s3 == s1 | s2
            else:
                assert not s1 <= s2 and s3 == s1 - s2 and s3


@pytest.mark.parametrize("sign", [1, -1])
def test_arithmetic_number_and_size(sign: int) -> None:
    rules = [Rule(0, "Arithmetic", "Number", sign), Rule(0, "Constant", "Type"),
             Rule(0, "Arithmetic", "Size", sign), Rule(0, "Constant", "Color")]
    seen_sizes = Counter()
    for rows in many("In_Distribute_Four", rules, 300, seed=9):
        for p1, p2, p3 in rows:
            assert len(p3.slots) == len(p1.slots) + sign * len(p2.slots)
            (z1,), (z2,), (z3,) = (levels(p, "size") for p in (p1, p2, p3))
            assert z3 == z1 + sign * (z2 + 1)
            seen_sizes[(z1, z2, z3)] += 1
    # In_Distribute_Four (sizes 2..5) leaves exactly one admissible Arithmetic row (docs/generator.md,
    # "Resulting rule distributions")
    assert set(seen_sizes) == ({(2, 2, 5)} if sign > 0 else {(5, 2, 2)})


@pytest.mark.parametrize("sign", [1, -1])
def test_arithmetic_color_white_alarm(sign: int) -> None:
    rules = [Rule(0, "Constant", "Number/Position"), Rule(0, "Constant", "Type"), Rule(0, "Constant", "Size"),
             Rule(0, "Arithmetic", "Color", sign)]
    row1_white = row3_white = 0
    for rows in many("Center_Single", rules, 3000, seed=10):
        colors = [[p.entities[0].color for p in row] for row in rows]
        for c1, c2, c3 in colors:
            assert c3 == c1 + sign * c2 and 0 <= c3 <= 9
        if colors[0][1] == 0:
            row1_white += 1
            assert colors[1][1] != 0  # rows 1 and 2 cannot both have a white second column
            assert colors[1][0] != (9 if sign > 0 else 0)
        row3_white += colors[2][1] == 0
    assert row1_white > 50 and row3_white > 50  # the alarm is rare-but-real, and row 3 is not checked


def test_generation_is_deterministic_per_seed() -> None:
    configuration = "in_distribute_four_out_center_single"
    for mode in ("balanced", "original"):
        first = generate_problem(configuration, problem_rng(3, configuration, 1), mode)
        again = generate_problem(configuration, problem_rng(3, configuration, 1), mode)
        other = generate_problem(configuration, problem_rng(4, configuration, 1), mode)
        assert first == again
        assert first != other


def test_generate_problem_rejects_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown configuration"):
        generate_problem("center", rng)
    with pytest.raises(ValueError, match="unknown candidate mode"):
        generate_problem("center_single", rng, mode="biased")
