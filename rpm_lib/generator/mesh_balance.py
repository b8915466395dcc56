"""Answer-blind Mesh Number alternatives of the balanced tree (docs/generator.md, "Mesh", "Line counts the
candidates do not give away").

The balanced (I-RAVEN) tree changes the Mesh's Number by drawing one alternative level b for the answer's
level a; half of the 8 candidates show a lines, half b. raven-datasets draws b uniformly over the other
levels 0..11, but the answer's own level is far from uniform (fresh counts are clamped at 9 lines, rules
rarely reach 10..12), so the *pair* {a, b} tells which one is the answer: the one with fewer lines, most of
the time. A reader who sees only the candidates is at chance exactly when the joint probability of
(answer level, alternative level) is symmetric, J(a, b) = J(b, a), while its row sums are fixed by the
answer's distribution pi(a).

We use the product form J(a, b) = w_a * w_b (a != b): the alternative is drawn from weights ``w`` over the
levels other than ``a``, q(b | a) = w_b / (W - w_a) with W = sum(w), and ``w`` solves
w_a * (W - w_a) = pi_a, so that pi_a * q(b | a) = w_a * w_b is symmetric. ``pi`` is the distribution of the
answer's Mesh level among the problems that reach this draw: the exact distribution of the Mesh rule's third
column (:func:`answer_level_distribution`), times the probability that the tree selected what it selected
given that level (the Mesh Position is only modifiable below 12 lines, which changes the quota). The
mesh-faithful candidate mode keeps raven-datasets' uniform draw.
"""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

import numpy as np

from rpm_lib.generator.constants import FRESH_NUMBER_MAX_LEVEL, LAYOUTS, MESH_LAYOUT
from rpm_lib.generator.problem import Rule

__all__ = ["answer_level_distribution", "selection_probability", "pair_weights", "alternative_distribution"]

_N_PERTURBED = 3


def _uniform(levels: range) -> dict[int, Fraction]:
    return {level: Fraction(1, len(levels)) for level in levels}


def _hypergeometric(n: int, k1: int, k2: int) -> dict[int, Fraction]:
    """P(|A & B| = j) for a fixed k1-set A and a uniform k2-subset B of n slots."""
    total = comb(n, k2)
    return {j: Fraction(comb(k1, j) * comb(n - k1, k2 - j), total)
            for j in range(max(0, k1 + k2 - n), min(k1, k2) + 1)}


@lru_cache(maxsize=None)
def answer_level_distribution(name: str, attr: str, value: int, start: tuple[int, int]) -> tuple[Fraction, ...]:
    """Exact distribution of the Mesh level (lines - 1) of the answer panel (row 3, column 3) under the Mesh
    Number/Position rule ``(name, attr, value)`` with pruned start range ``start``: a tuple over levels
    0..11. Mirrors ``rows._number_position_rows`` on the Mesh layout (12 slots, fresh counts clamped at
    ``FRESH_NUMBER_MAX_LEVEL``)."""
    spec = LAYOUTS[MESH_LAYOUT]
    n = len(spec.slots)
    low, high = spec.number
    fresh = _uniform(range(start[0], min(start[1], FRESH_NUMBER_MAX_LEVEL) + 1))
    out = [Fraction(0)] * (high + 1)
    if name == "Constant" or (attr == "Position" and name in ("Progression", "Distribute_Three")):
        for level, p in fresh.items():  # the count never changes along the row
            out[level] += p
    elif name == "Progression":  # Number
        for level, p in fresh.items():
            out[level + 2 * value] += p
    elif name == "Arithmetic" and attr == "Number":
        for l1, p in fresh.items():
            if value > 0:
                seconds = range(start[0], min(high - l1 - 1, FRESH_NUMBER_MAX_LEVEL) + 1)
            else:
                seconds = range(low, min(l1 - low - 1, FRESH_NUMBER_MAX_LEVEL) + 1)
            for l2 in seconds:
                out[l1 + l2 + 1 if value > 0 else l1 - l2 - 1] += p / len(seconds)
    elif name == "Arithmetic":  # Position: union (+) or difference (-) of two slot sets, column 2 redrawn
        for l1, p in fresh.items():  # until the union adds (the difference leaves) something
            k1 = l1 + 1
            outcomes: dict[int, Fraction] = {}
            for l2, q in fresh.items():
                k2 = l2 + 1
                for j, h in _hypergeometric(n, k1, k2).items():
                    if value > 0 and j < k2:
                        outcomes[k1 + k2 - j - 1] = outcomes.get(k1 + k2 - j - 1, 0) + q * h
                    elif value < 0 and j < k1:
                        outcomes[k1 - j - 1] = outcomes.get(k1 - j - 1, 0) + q * h
            accepted = sum(outcomes.values())
            for level, r in outcomes.items():
                out[level] += p * r / accepted
    elif name == "Distribute_Three":  # Number: row 3 ends with the first value or the first other, 1/2 each
        for a0, p in fresh.items():
            others = [level for level in range(start[0], start[1] + 1) if level != a0]
            out[a0] += p / 2
            for level in others:
                out[level] += p / 2 / len(others)
    else:
        raise ValueError(f"unknown Mesh Number/Position rule {name} {attr}")
    if sum(out) != 1:
        raise AssertionError(f"answer level distribution of {name} {attr} {value} does not sum to 1")
    return tuple(out)


def selection_probability(n_mesh: int, n_rest: int, mesh_selected: int, rest_selected: int) -> Fraction:
    """Probability that ``candidates.select_attributes`` selects a given set holding ``mesh_selected`` of the
    ``n_mesh`` modifiable Mesh attributes and ``rest_selected`` of the ``n_rest`` others (the quota)."""
    if n_mesh + n_rest <= _N_PERTURBED:
        return Fraction(int(mesh_selected == n_mesh and rest_selected == n_rest))
    m = mesh_selected
    if not 1 <= m <= n_mesh or rest_selected != _N_PERTURBED - m or rest_selected > n_rest:
        return Fraction(0)
    return Fraction(1, n_mesh * comb(n_mesh, m) * comb(n_rest, rest_selected))


@lru_cache(maxsize=None)
def pair_weights(pi: tuple[Fraction, ...]) -> tuple[float, ...] | None:
    """Weights ``w`` with w_a * (W - w_a) = pi_a (W = sum(w)), so that drawing the alternative b != a with
    probability w_b / (W - w_a) makes pi_a * q(b | a) = w_a * w_b symmetric. ``None`` when no symmetric
    pairing exists (fewer than 2 possible levels, or one level with half of the mass or more)."""
    p = np.array([float(x) for x in pi])
    support = p > 0
    if support.sum() < 2 or p.max() >= 0.5:
        return None
    w = np.sqrt(p)
    for _ in range(10000):  # symmetric scaling, geometric-mean damped: converges for max(pi) < 1/2
        target = np.where(support, p / np.maximum(w.sum() - w, 1e-300), 0.0)
        new = np.sqrt(w * target)
        if np.max(np.abs(new - w)) < 1e-15:
            w = new
            break
        w = new
    scale = w.sum()
    residual = np.max(np.abs(w * (scale - w) - p))
    if residual > 1e-12:
        return None
    return tuple(float(x) for x in w)


def alternative_distribution(
    rule: Rule, start: tuple[int, int], answer_level: int, n_rest: int, selected_mesh_attrs: frozenset[str],
    rest_selected: int, allowed: list[int],
) -> list[float] | None:
    """Probabilities of the Mesh Number alternative over ``allowed`` (levels other than ``answer_level``),
    or ``None`` when no answer-blind pairing exists here (then the caller draws uniformly, as the reference).

    ``rule``/``start``: the Mesh Number/Position rule and its pruned start range; ``n_rest``: modifiable
    non-Mesh attributes; ``selected_mesh_attrs``: the Mesh attributes the tree selected (with "Number");
    ``rest_selected``: how many non-Mesh attributes it selected.
    """
    top = LAYOUTS[MESH_LAYOUT].number[1]
    base = answer_level_distribution(rule.name, rule.attr, rule.value, start)
    mesh_selected = len(selected_mesh_attrs)
    pi = []
    for level, p in enumerate(base):
        position = rule.attr != "Number" and level != top  # the Mesh Position is modifiable below 12 lines
        if "Position" in selected_mesh_attrs and not position:
            pi.append(Fraction(0))
            continue
        n_mesh = 1 + position
        pi.append(p * selection_probability(n_mesh, n_rest, mesh_selected, rest_selected))
    total = sum(pi)
    if total == 0:
        return None
    weights = pair_weights(tuple(x / total for x in pi))
    if weights is None or weights[answer_level] == 0 or any(
            weights[level] > 0 and level not in allowed for level in range(len(weights)) if level != answer_level):
        return None
    chosen = [weights[level] for level in allowed]
    norm = sum(chosen)
    return [x / norm for x in chosen]
