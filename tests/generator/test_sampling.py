"""Rule sampling (docs/generator.md, "Rule sampling and pruning"): exact conditional tables, pruned start
ranges, and chi-square fidelity of draws."""
from __future__ import annotations

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest
from scipy.stats import chisquare

from rpm_lib.generator.api import generate_problems, problem_rng
from rpm_lib.generator.constants import CONFIG_SPECS
from rpm_lib.generator.problem import Rule
from rpm_lib.generator.sampling import RandomStream, prune_range, pruned_ranges, rule_table, sample_rules
from rpm_lib.rules import CONFIGURATIONS

# --- docs/generator.md "Resulting rule distributions", written out by hand:
# {(relation, attribute, parameter): (probability, start range)} ---------------------------------------------

_SINGLE_NP = {("Constant", "Number/Position", 0): (F(1), (0, 0))}
_GRID4_NP = {
    ("Progression", "Number", -1): (F(1, 24), (2, 3)),
    ("Progression", "Number", 1): (F(1, 24), (0, 1)),
    ("Progression", "Position", -1): (F(1, 24), (0, 1)),
    ("Progression", "Position", 1): (F(1, 24), (0, 1)),
    ("Arithmetic", "Number", 1): (F(1, 12), (0, 2)),
    ("Arithmetic", "Number", -1): (F(1, 12), (1, 3)),
    ("Arithmetic", "Position", 1): (F(1, 12), (0, 2)),
    ("Arithmetic", "Position", -1): (F(1, 12), (1, 2)),
    ("Distribute_Three", "Number", 0): (F(1, 6), (0, 3)),
    ("Distribute_Three", "Position", 0): (F(1, 6), (0, 2)),
    ("Constant", "Number/Position", 0): (F(1, 6), (0, 3)),
}
_GRID9_NP = {
    ("Progression", "Number", -2): (F(1, 28), (4, 8)),
    ("Progression", "Number", -1): (F(1, 28), (2, 8)),
    ("Progression", "Number", 1): (F(1, 28), (0, 6)),
    ("Progression", "Number", 2): (F(1, 28), (0, 4)),
    ("Progression", "Position", -2): (F(1, 28), (0, 4)),
    ("Progression", "Position", -1): (F(1, 28), (0, 6)),
    ("Progression", "Position", 1): (F(1, 28), (0, 6)),
    ("Progression", "Position", 2): (F(1, 28), (0, 4)),
    ("Arithmetic", "Number", 1): (F(1, 14), (0, 7)),
    ("Arithmetic", "Number", -1): (F(1, 14), (1, 8)),
    ("Arithmetic", "Position", 1): (F(1, 14), (0, 7)),
    ("Arithmetic", "Position", -1): (F(1, 14), (4, 7)),
    ("Distribute_Three", "Number", 0): (F(1, 7), (0, 8)),
    ("Distribute_Three", "Position", 0): (F(1, 7), (0, 7)),
    ("Constant", "Number/Position", 0): (F(1, 7), (0, 8)),
}
_TYPE = {
    ("Progression", "Type", -2): (F(1, 12), (5, 5)),
    ("Progression", "Type", -1): (F(1, 12), (3, 5)),
    ("Progression", "Type", 1): (F(1, 12), (1, 3)),
    ("Progression", "Type", 2): (F(1, 12), (1, 1)),
    ("Distribute_Three", "Type", 0): (F(1, 3), (1, 5)),
    ("Constant", "Type", 0): (F(1, 3), (1, 5)),
}
_SIZE = {
    ("Progression", "Size", -2): (F(1, 16), (4, 5)),
    ("Progression", "Size", -1): (F(1, 16), (2, 5)),
    ("Progression", "Size", 1): (F(1, 16), (0, 3)),
    ("Progression", "Size", 2): (F(1, 16), (0, 1)),
    ("Arithmetic", "Size", 1): (F(1, 8), (0, 4)),
    ("Arithmetic", "Size", -1): (F(1, 8), (1, 5)),
    ("Distribute_Three", "Size", 0): (F(1, 4), (0, 5)),
    ("Constant", "Size", 0): (F(1, 4), (0, 5)),
}
_SIZE_OUT = {
    ("Progression", "Size", -1): (F(1, 10), (5, 5)),
    ("Progression", "Size", 1): (F(1, 10), (3, 3)),
    ("Distribute_Three", "Size", 0): (F(2, 5), (3, 5)),
    ("Constant", "Size", 0): (F(2, 5), (3, 5)),
}
_SIZE_IN4 = {
    ("Progression", "Size", -1): (F(1, 14), (4, 5)),
    ("Progression", "Size", 1): (F(1, 14), (2, 3)),
    ("Arithmetic", "Size", 1): (F(1, 7), (2, 2)),
    ("Arithmetic", "Size", -1): (F(1, 7), (5, 5)),
    ("Distribute_Three", "Size", 0): (F(2, 7), (2, 5)),
    ("Constant", "Size", 0): (F(2, 7), (2, 5)),
}
_COLOR = {
    ("Progression", "Color", -2): (F(1, 16), (4, 9)),
    ("Progression", "Color", -1): (F(1, 16), (2, 9)),
    ("Progression", "Color", 1): (F(1, 16), (0, 7)),
    ("Progression", "Color", 2): (F(1, 16), (0, 5)),
    ("Arithmetic", "Color", 1): (F(1, 8), (0, 9)),
    ("Arithmetic", "Color", -1): (F(1, 8), (0, 9)),
    ("Distribute_Three", "Color", 0): (F(1, 4), (0, 9)),
    ("Constant", "Color", 0): (F(1, 4), (0, 9)),
}
_COLOR_OUT = {("Constant", "Color", 0): (F(1), (0, 0))}

SPEC_TABLES: dict[str, tuple[dict, dict, dict, dict]] = {
    "Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "Left_Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "Right_Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "Up_Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "Down_Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "In_Center_Single": (_SINGLE_NP, _TYPE, _SIZE, _COLOR),
    "Out_Center_Single": (_SINGLE_NP, _TYPE, _SIZE_OUT, _COLOR_OUT),
    "Distribute_Four": (_GRID4_NP, _TYPE, _SIZE, _COLOR),
    "In_Distribute_Four": (_GRID4_NP, _TYPE, _SIZE_IN4, _COLOR),
    "Distribute_Nine": (_GRID9_NP, _TYPE, _SIZE, _COLOR),
}

DRAWS_PER_CONFIGURATION = 20_000


@pytest.mark.parametrize("layout", sorted(SPEC_TABLES))
@pytest.mark.parametrize("group", range(4))
def test_rule_table_matches_spec(layout: str, group: int) -> None:
    table = {(o.name, o.attr, o.value): (o.probability, o.start) for o in rule_table(layout, group)}
    assert table == SPEC_TABLES[layout][group]


@pytest.mark.parametrize(
    "rule, low, high, expected",
    [
        (("Arithmetic", "Position", -1), 0, 8, (4, 7)),  # floor division as in Python 2
        (("Arithmetic", "Color", 1), 0, 0, (0, -1)),  # a single colour cannot be added to
        (("Distribute_Three", "Position", 0), 0, 0, (0, -1)),
        (("Progression", "Position", -2), 0, 3, (0, -1)),
        (("Arithmetic", "Size", -1), 2, 5, (5, 5)),
    ],
)
def test_prune_range_examples(rule, low, high, expected) -> None:
    assert prune_range(*rule, low, high) == expected


def test_pruned_ranges_rejects_infeasible_rule() -> None:
    rules = [Rule(0, "Progression", "Number", 2)] + [Rule(0, "Constant", a) for a in ("Type", "Size", "Color")]
    with pytest.raises(ValueError, match="Distribute_Four"):
        pruned_ranges("Distribute_Four", rules)


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_sampled_rule_frequencies_match_spec(configuration: str) -> None:
    """Chi-square per (component, rule group) over 20,000 draws; fixed seed, so it cannot flake."""
    stream = RandomStream(np.random.default_rng(CONFIGURATIONS.index(configuration) + 100))
    layouts = [layout for _, layout in CONFIG_SPECS[configuration].components]
    counts = [[Counter() for _ in range(4)] for _ in layouts]
    for _ in range(DRAWS_PER_CONFIGURATION):
        rules, ranges = sample_rules(configuration, stream)
        assert len(rules) == 4 * len(layouts)
        for i, rule in enumerate(rules):
            c, g = divmod(i, 4)
            assert rule.component == c
            counts[c][g][(rule.name, rule.attr, rule.value)] += 1
            # the returned start range is the one of the hand-written table for the sampled rule
            start = SPEC_TABLES[layouts[c]][g][(rule.name, rule.attr, rule.value)][1]
            assert (ranges[c].number, ranges[c].type, ranges[c].size, ranges[c].color)[g] == start
    for c, layout in enumerate(layouts):
        for g in range(4):
            expected = SPEC_TABLES[layout][g]
            assert set(counts[c][g]) <= set(expected), f"{layout} group {g}: impossible rule sampled"
            keys = sorted(expected)
            if len(keys) == 1:
                assert counts[c][g][keys[0]] == DRAWS_PER_CONFIGURATION
                continue
            observed = [counts[c][g][k] for k in keys]
            probabilities = [float(expected[k][0]) for k in keys]
            result = chisquare(observed, [p * DRAWS_PER_CONFIGURATION for p in probabilities])
            assert result.pvalue > 1e-3, f"{configuration} component {c} group {g}: {dict(zip(keys, observed))}"


def test_mean_rules_per_problem_is_44_over_7() -> None:
    total = 0
    for configuration in CONFIGURATIONS:
        for problem in generate_problems(configuration, 20, seed=5):
            groups = [(r.component, r.attr) for r in problem.rules]
            assert len(problem.rules) == 4 * len(CONFIG_SPECS[configuration].components)
            assert [g[1] if g[1] in ("Type", "Size", "Color") else "N/P" for g in groups[:4]] == [
                "N/P", "Type", "Size", "Color"
            ]
            total += len(problem.rules)
    assert F(total, 20 * len(CONFIGURATIONS)) == F(44, 7)


def test_random_stream_is_deterministic_and_in_range() -> None:
    a = RandomStream(np.random.default_rng(3), block=7)
    b = RandomStream(np.random.default_rng(3), block=64)
    draws_a = [a.integer(2, 5) for _ in range(2000)]
    draws_b = [b.integer(2, 5) for _ in range(2000)]
    assert draws_a == draws_b  # block size must not change the numbers
    assert set(draws_a) == {2, 3, 4, 5}
    assert chisquare(list(Counter(draws_a).values())).pvalue > 1e-3
    subset = a.sample(9, 4)
    assert len(set(subset)) == 4 and all(0 <= x < 9 for x in subset)
    with pytest.raises(TypeError):
        RandomStream(np.random.RandomState(0))  # type: ignore[arg-type]


def test_random_stream_sample_orders_are_uniform() -> None:
    s = RandomStream(np.random.default_rng(11))
    counts = Counter(tuple(s.sample(4, 2)) for _ in range(12_000))
    assert len(counts) == 12  # all ordered pairs of distinct values
    assert chisquare(list(counts.values())).pvalue > 1e-3


def test_problem_rng_streams_are_independent_of_position() -> None:
    run = list(generate_problems("distribute_four", 6, seed=9))
    tail = list(generate_problems("distribute_four", 2, seed=9, start=4))
    assert tail[0] == run[4] and tail[1] == run[5]
    assert run[0] != run[1]
    other = problem_rng(9, "distribute_nine", 0).random(4)
    assert not np.array_equal(problem_rng(9, "distribute_four", 0).random(4), other)
    with pytest.raises(ValueError, match="unknown configuration"):
        problem_rng(9, "no_such_configuration", 0)
