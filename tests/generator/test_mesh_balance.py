"""Answer-blind Mesh Number alternatives (rpm_lib.generator.mesh_balance; docs/generator.md, "Line counts the
candidates do not give away") and the mesh-faithful mode that keeps raven-datasets' draws."""
from __future__ import annotations

import hashlib
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from rpm_lib.generator.api import generate_problems
from rpm_lib.generator.candidates import MESH_FAITHFUL, MODES, check_mode
from rpm_lib.generator.constants import FRESH_NUMBER_MAX_LEVEL, LAYOUTS, MESH_LAYOUT
from rpm_lib.generator.mesh_balance import (
    alternative_distribution,
    answer_level_distribution,
    pair_weights,
    selection_probability,
)
from rpm_lib.generator.problem import Rule
from rpm_lib.generator.rows import generate_component_rows
from rpm_lib.generator.sampling import RandomStream, pruned_ranges, regime_rule_table
from rpm_lib.rules import CONFIGURATIONS

MESH = "I-RAVEN-Mesh"
CONSTANT_TSC = [Rule(0, "Constant", attr) for attr in ("Type", "Size", "Color")]
TOP = LAYOUTS[MESH_LAYOUT].number[1]
MESH_OPTIONS = regime_rule_table("center_single", 1, 0, regime=MESH)


def _rule(option) -> Rule:
    return Rule(0, option.name, option.attr, option.value)


@pytest.mark.parametrize("option", MESH_OPTIONS, ids=lambda o: f"{o.name}-{o.attr}-{o.value}")
def test_the_exact_answer_level_distribution_matches_the_row_generator(option):
    exact = answer_level_distribution(option.name, option.attr, option.value, option.start)
    assert sum(exact) == 1
    rules = [_rule(option)] + CONSTANT_TSC
    ranges = pruned_ranges(MESH_LAYOUT, rules)
    assert ranges.number == option.start
    stream = RandomStream(np.random.default_rng(11))
    counts = Counter(generate_component_rows(rules, ranges, stream)[2][2].number for _ in range(3000))
    support = [level for level, p in enumerate(exact) if p > 0]
    assert set(counts) <= set(support)
    if len(support) > 1:
        test = chisquare([counts[level] for level in support], [3000 * float(exact[level]) for level in support])
        assert test.pvalue > 1e-4, (option, test.pvalue)


def test_answer_levels_are_clamped_fresh_counts_under_a_constant_rule():
    exact = answer_level_distribution("Constant", "Number/Position", 0, LAYOUTS[MESH_LAYOUT].number)
    assert exact == tuple(Fraction(1, FRESH_NUMBER_MAX_LEVEL + 1) if level <= FRESH_NUMBER_MAX_LEVEL else 0
                          for level in range(TOP + 1))


def test_selection_probability_is_the_quota():
    # 2 Mesh attributes, 4 others: m = 1 (1/2, then one of the 2) or m = 2 (1/2), others without replacement
    assert selection_probability(2, 4, 1, 2) == Fraction(1, 2) * Fraction(1, 2) / 6
    assert selection_probability(2, 4, 2, 1) == Fraction(1, 2) / 4
    assert selection_probability(1, 4, 1, 2) == Fraction(1, 6)
    assert selection_probability(2, 4, 0, 3) == 0
    assert selection_probability(1, 2, 1, 2) == 1  # 3 entries: all of them
    total = sum(selection_probability(2, 4, m, 3 - m) * (2 if m == 1 else 1) * (6 if m == 1 else 4) for m in (1, 2))
    assert total == 1


def _check_symmetric(pi: list[float], weights: tuple[float, ...]) -> None:
    w = np.array(weights)
    joint = np.outer(w, w)
    np.fill_diagonal(joint, 0)
    assert np.allclose(joint.sum(axis=1), pi, atol=1e-12)
    assert np.allclose(joint, joint.T)


def test_pair_weights_give_a_symmetric_joint_with_the_answer_marginal():
    rng = np.random.default_rng(5)
    pis = [[float(x) for x in answer_level_distribution(o.name, o.attr, o.value, o.start)] for o in MESH_OPTIONS]
    pis += [list(rng.dirichlet(np.ones(12))) for _ in range(20)]
    for pi in pis:
        if max(pi) >= 0.5:
            continue
        weights = pair_weights(tuple(Fraction(x) for x in pi))
        assert weights is not None
        _check_symmetric(pi, weights)
    assert pair_weights((Fraction(1),) + (Fraction(0),) * 11) is None  # one possible level: nothing to pair
    assert pair_weights((Fraction(1, 2), Fraction(1, 4), Fraction(1, 4))) is None  # half the mass on one level


@pytest.mark.parametrize("option", MESH_OPTIONS, ids=lambda o: f"{o.name}-{o.attr}-{o.value}")
def test_answer_and_alternative_levels_are_exchangeable(option):
    """pi(a) q(b | a) == pi(b) q(a | b) for every selection the tree can make, pi being the answer's level
    distribution among the problems that reach the draw (zero where the selection is impossible)."""
    rule = _rule(option)
    base = answer_level_distribution(option.name, option.attr, option.value, option.start)
    classes = [(frozenset({"Number"}), 2, 4), (frozenset({"Number"}), 2, 2)]
    if option.attr != "Number":
        classes.append((frozenset({"Number", "Position"}), 1, 4))
    for mesh_attrs, rest_selected, n_rest in classes:
        pi, q = np.zeros(TOP + 1), np.zeros((TOP + 1, TOP + 1))
        for a in range(TOP + 1):
            position = rule.attr != "Number" and a != TOP
            if base[a] == 0 or ("Position" in mesh_attrs and not position):
                continue
            pi[a] = float(base[a] * selection_probability(1 + position, n_rest, len(mesh_attrs), rest_selected))
            allowed = [b for b in range(TOP + 1) if b != a and not ("Position" in mesh_attrs and b == TOP)]
            probabilities = alternative_distribution(rule, option.start, a, n_rest, mesh_attrs, rest_selected, allowed)
            assert probabilities is not None and abs(sum(probabilities) - 1) < 1e-12
            q[a, allowed] = probabilities
        joint = pi[:, None] * q
        assert np.allclose(joint, joint.T, atol=1e-15), (option, mesh_attrs)


def _number_pairs(mode: str, per_config: int, seed: int) -> Counter:
    """Per problem whose Mesh Number was changed: the sign of (alternative lines - answer lines)."""
    signs: Counter = Counter()
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, per_config, seed=seed, regime=MESH, mode=mode):
            lines = [len(c.components[-1].slots) for c in p.candidates]
            answer = lines[p.target]
            others = {count for count in lines if count != answer}
            if others:
                signs[int(np.sign(others.pop() - answer))] += 1
    return signs


def test_distractors_have_more_lines_only_in_the_faithful_mode():
    balanced = _number_pairs("balanced", 300, seed=21)
    faithful = _number_pairs(MESH_FAITHFUL, 300, seed=21)
    assert binomtest(balanced[1], balanced[1] + balanced[-1]).pvalue > 1e-3, balanced
    assert binomtest(faithful[1], faithful[1] + faithful[-1], alternative="greater").pvalue < 1e-6, faithful


def test_fewest_lines_is_at_chance_by_default():
    hits = total = 0.0
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 300, seed=22, regime=MESH):
            lines = [len(c.components[-1].slots) for c in p.candidates]
            fewest = [j for j, count in enumerate(lines) if count == min(lines)]
            hits += (p.target in fewest) / len(fewest)
            total += 1
    assert abs(hits / total - 1 / 8) < 0.02, hits / total  # 2,100 problems: 99 % of chance within +-1.9 points


def test_twelve_line_alternatives_exist_by_default_when_another_position_is_perturbed():
    """raven-datasets asks the Mesh Number for two position sets whenever any Position is selected, so then no
    distractor gets 12 lines (one set only) although the answer may have them; by default only the Mesh's
    own Position does."""
    def twelve_line_alternatives(mode: str) -> int:
        found = 0
        for p in generate_problems("distribute_four", 2500, seed=23, regime=MESH, mode=mode):
            changed = {pair for path in p.modified for pair in path}
            if (0, "Position") in changed and (1, "Number") in changed:
                lines = [len(c.components[-1].slots) for c in p.candidates]
                found += lines[p.target] != 12 and 12 in lines
        return found

    assert twelve_line_alternatives("balanced") > 0
    assert twelve_line_alternatives(MESH_FAITHFUL) == 0


# Digest of 20 Mesh problems per configuration (seed 2024) made by the generator before answer-blind Mesh
# alternatives existed: the mesh-faithful mode must reproduce it bit for bit.
MESH_BEFORE_DIGEST = "2d508705c4ed244728846a3e39cc5d380f115f1f6ef1ba6497bc444979d25c6c"


def _digest(mode: str) -> str:
    h = hashlib.sha256()
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 20, seed=2024, regime=MESH, mode=mode):
            h.update(repr((p.context, p.candidates, p.target, p.rules, p.modified)).encode())
    return h.hexdigest()


def test_the_faithful_mode_is_the_generator_before_the_fix():
    assert _digest(MESH_FAITHFUL) == MESH_BEFORE_DIGEST
    assert _digest("balanced") != MESH_BEFORE_DIGEST


def test_the_faithful_mode_needs_the_mesh():
    assert MESH_FAITHFUL in MODES
    check_mode(MESH_FAITHFUL, mesh=True)
    with pytest.raises(ValueError, match="needs the Mesh"):
        check_mode(MESH_FAITHFUL, mesh=False)
    with pytest.raises(ValueError, match="needs the Mesh"):
        next(generate_problems("center_single", 1, mode=MESH_FAITHFUL))
