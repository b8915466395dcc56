"""Validity checker: which candidates satisfy every rule of a RAVEN / I-RAVEN problem (docs/generator.md,
"Row generation").

Works from what a file stores -- panel attributes (levels) and rule *names and attributes* -- so it runs on
generated problems and on problems parsed from reference .xml files alike. Rule parameters are inferred
from the context: Progression steps from rows 1-2, Arithmetic signs from the row(s) where they are
unambiguous, Distribute_Three value triples (counts, position sets or levels) from row 1. ``Rule.value`` is
ignored.

Only what the generator makes visible is checked (docs/generator.md, "Visible and hidden attributes"):

- Number/Position rules on Number (and Arithmetic on Position) constrain counts (sets) only; positions and
  non-uniform entities are random there.
- A non-Constant Type/Size/Color rule makes all entities of a panel share the ruled level.
- A Constant Type/Size/Color rule constrains (a) every entity of the row, if the layout is uniform (all
  entities are copies of one), or (b) each entity against the entity it was carried from, if the N/P rule
  carries entities (Constant: same slot; Progression-Position: slot + step; Distribute_Three-Position: same
  entity index -- the only link the stored entity order gives); otherwise it constrains nothing.

Deliberate choice: Progression-Position steps are read from the entity order when it is consistent (the
direction of a move of distinguishable entities is visible); only if not, from the occupied slot sets.

:func:`solver_score` counts the satisfied rules the way the reference generators' heuristic solver does (one
kind of check differs from ours); RAVEN-FAIR's candidate generator rejects a distractor by that count.

Mesh problems (docs/generator.md, "Mesh") need nothing special: the Mesh is checked as one more component.
Its lines all look alike (Type 6, Size/Color/Angle 0), so only its Number and Position carry information and
its Constant Type/Size/Color rules always hold; a Progression on its Position is a shift of +-3 slots (mod 12),
inferred like any other shift (when two shifts fit the context, they predict the same slot set).
"""
from __future__ import annotations

from dataclasses import dataclass

from rpm_lib.generator.constants import LAYOUTS
from rpm_lib.generator.problem import ComponentPanel, Panel, Problem, Rule

__all__ = [
    "RuleCheck",
    "InferredRule",
    "infer_rules",
    "infer_context_rules",
    "check_context",
    "check_candidate",
    "satisfying_candidates",
    "solver_score",
    "explain",
]

_UNIFORM_LEVEL = 3


@dataclass(frozen=True)
class RuleCheck:
    """Outcome of checking one rule: ``satisfied`` and a human-readable ``reason``."""

    rule: Rule
    satisfied: bool
    reason: str


@dataclass(frozen=True)
class InferredRule:
    """A rule with the parameter inferred from the context.

    Attributes:
        rule: the rule (``value`` is not used).
        parameter: Progression step (levels; for Position the slot shift modulo the slot count);
            Arithmetic sign (+1 / -1, or 0 when the context cannot tell and both signs predict the same);
            Distribute_Three: the frozenset of the 3 values (counts, levels, or frozensets of slots);
            ``None`` for Constant.
        scope: for Constant Type/Size/Color: ``"uniform"``, ``"carried"`` or ``"free"`` (see module doc);
            ``""`` otherwise.
        error: why the context itself breaks the rule, or ``None``.
    """

    rule: Rule
    parameter: object = None
    scope: str = ""
    error: str | None = None


class _ContextError(Exception):
    pass


def _rows(context: list[Panel], c: int) -> list[list[ComponentPanel]]:
    """Rows 1, 2 (3 panels) and row 3 (2 panels) of component ``c``."""
    ctx = [p.components[c] for p in context]
    return [ctx[0:3], ctx[3:6], ctx[6:8]]


def _count(p: ComponentPanel) -> int:
    return len(p.slots)


def _set(p: ComponentPanel) -> frozenset:
    return frozenset(p.slots)


def _level(p: ComponentPanel, attr: str) -> int | None:
    """The level shared by all entities of the panel, or None when they differ."""
    values = {getattr(e, attr) for e in p.entities}
    return values.pop() if len(values) == 1 else None


def _n_slots(p: ComponentPanel) -> int:
    if p.layout not in LAYOUTS:
        raise ValueError(f"unknown layout {p.layout!r} in problem panel")
    return len(LAYOUTS[p.layout].slots)


def _consecutive_pairs(rows: list[list[ComponentPanel]]):
    for row in rows:
        for a, b in zip(row, row[1:]):
            yield a, b


# -------------------------------------------------------------------------------------------------
# Parameter inference
# -------------------------------------------------------------------------------------------------


def _shift_is_entitywise(a: ComponentPanel, b: ComponentPanel, d: int, n: int) -> bool:
    return len(a.slots) == len(b.slots) and all((x + d) % n == y for x, y in zip(a.slots, b.slots))


def _shift_is_setwise(a: ComponentPanel, b: ComponentPanel, d: int, n: int) -> bool:
    return frozenset((x + d) % n for x in a.slots) == _set(b)


def _infer_number_position(rule: Rule, rows: list[list[ComponentPanel]]):
    name, attr = rule.name, rule.attr
    full = rows[:2]
    if name == "Constant":
        for a, b in _consecutive_pairs(rows):
            if _set(a) != _set(b):
                raise _ContextError("occupied slots change along a row")
        return None
    if name == "Progression" and attr == "Number":
        step = _count(rows[0][1]) - _count(rows[0][0])
        if step == 0:
            raise _ContextError("count does not change in row 1")
        for a, b in _consecutive_pairs(rows):
            if _count(b) - _count(a) != step:
                raise _ContextError(f"counts do not progress by {step:+d}")
        return step
    if name == "Progression":  # Position
        n = _n_slots(rows[0][0])
        pairs = list(_consecutive_pairs(rows))
        shifts = [d for d in range(1, n) if all(_shift_is_setwise(a, b, d, n) for a, b in pairs)]
        if not shifts:
            raise _ContextError("occupied slots do not shift by a constant step")
        for d in shifts:
            if all(_shift_is_entitywise(a, b, d, n) for a, b in pairs):
                return d
        return shifts[0]
    if name == "Arithmetic":
        def signs(r):
            c1, c2, c3 = r
            found = set()
            if attr == "Number":
                if _count(c3) == _count(c1) + _count(c2):
                    found.add(1)
                if _count(c3) == _count(c1) - _count(c2):
                    found.add(-1)
            else:
                if _set(c3) == _set(c1) | _set(c2):
                    found.add(1)
                if _set(c3) == _set(c1) - _set(c2):
                    found.add(-1)
            return found

        common = signs(full[0]) & signs(full[1])
        if not common:
            raise _ContextError(f"rows 1-2 do not follow one Arithmetic {attr} operation")
        return common.pop() if len(common) == 1 else 0
    if name == "Distribute_Three":
        key = _count if attr == "Number" else _set
        values = frozenset(key(p) for p in full[0])
        if len(values) != 3:
            raise _ContextError(f"row 1 does not show 3 distinct {attr.lower()} values")
        for row in rows:
            row_values = [key(p) for p in row]
            if len(set(row_values)) != len(row_values) or not set(row_values) <= values:
                raise _ContextError(f"a row does not distribute the 3 {attr.lower()} values of row 1")
        return values
    raise _ContextError(f"unknown rule {name} on {attr}")


def _entity_pairs(np_rule: InferredRule, a: ComponentPanel, b: ComponentPanel):
    """Pairs (entity in a, entity it was carried to in b) under an entity-carrying N/P rule, or None."""
    if len(a.entities) != len(b.entities):
        return None
    name = np_rule.rule.name
    if name == "Distribute_Three":  # Position: entity i goes to the i-th slot of the next set
        return list(zip(a.entities, b.entities))
    shift = np_rule.parameter if name == "Progression" else 0
    n = _n_slots(a)
    at = dict(zip(b.slots, b.entities))
    pairs = []
    for slot, entity in zip(a.slots, a.entities):
        target = at.get((slot + shift) % n)
        if target is None:
            return None
        pairs.append((entity, target))
    return pairs


def _constant_scope(np_rule: InferredRule, uniform: bool) -> str:
    if uniform:
        return "uniform"
    name, attr = np_rule.rule.name, np_rule.rule.attr
    if name == "Constant" or (attr == "Position" and name in ("Progression", "Distribute_Three")):
        return "carried"
    return "free"


def _infer_entity_rule(rule: Rule, rows: list[list[ComponentPanel]], np_rule: InferredRule, uniform: bool):
    attr = rule.attr.lower()
    name = rule.name
    if name == "Constant":
        scope = _constant_scope(np_rule, uniform)
        if scope == "uniform":
            for row in rows:
                if len({getattr(e, attr) for p in row for e in p.entities}) != 1:
                    raise _ContextError(f"{attr} differs within a row of a uniform layout")
        elif scope == "carried":
            if np_rule.error is not None:
                raise _ContextError("the Number/Position rule does not hold, so entities cannot be traced")
            for a, b in _consecutive_pairs(rows):
                pairs = _entity_pairs(np_rule, a, b)
                if pairs is None or any(getattr(x, attr) != getattr(y, attr) for x, y in pairs):
                    raise _ContextError(f"{attr} of a carried entity changes")
        return None, scope
    levels = []
    for row in rows:
        row_levels = [_level(p, attr) for p in row]
        if None in row_levels:
            raise _ContextError(f"entities of a context panel have different {attr}")
        levels.append(row_levels)
    if name == "Progression":
        step = levels[0][1] - levels[0][0]
        if step == 0:
            raise _ContextError(f"{attr} does not change in row 1")
        for row in levels:
            if any(y - x != step for x, y in zip(row, row[1:])):
                raise _ContextError(f"{attr} does not progress by {step:+d}")
        return step, ""
    if name == "Arithmetic":
        offset = 1 if attr == "size" else 0  # Size works on level + 1 (value 0.4 .. 0.9), Color on levels

        def signs(r):
            found = set()
            if r[2] == r[0] + r[1] + offset:
                found.add(1)
            if r[2] == r[0] - r[1] - offset:
                found.add(-1)
            return found

        row1, row2 = signs(levels[0]), signs(levels[1])
        if not row1 or not row2:
            raise _ContextError(f"rows 1-2 do not follow an Arithmetic {attr} operation")
        common = row1 & row2
        if not common:
            raise _ContextError(f"rows 1 and 2 use different Arithmetic {attr} operations")
        return (common.pop() if len(common) == 1 else 0), ""
    if name == "Distribute_Three":
        values = frozenset(levels[0])
        if len(values) != 3:
            raise _ContextError(f"row 1 does not show 3 distinct {attr} levels")
        for row in levels:
            if len(set(row)) != len(row) or not set(row) <= values:
                raise _ContextError(f"a row does not distribute the 3 {attr} levels of row 1")
        return values, ""
    raise _ContextError(f"unknown rule {name} on {rule.attr}")


def infer_rules(problem: Problem) -> list[InferredRule]:
    """Infer every rule's parameter from the 8 context panels (in ``problem.rules`` order)."""
    return infer_context_rules(problem.context, problem.rules)


def infer_context_rules(context: list[Panel], rules: list[Rule]) -> list[InferredRule]:
    """:func:`infer_rules` from the 8 context panels and the rules alone (before the candidates exist)."""
    if len(context) != 8 or len(rules) % 4 != 0:
        raise ValueError(
            f"problem needs 8 context panels and 4 rules per component, got {len(context)} panels "
            f"and {len(rules)} rules"
        )
    inferred: list[InferredRule] = []
    for c in range(len(rules) // 4):
        group = rules[4 * c: 4 * c + 4]
        if any(rule.component != c for rule in group):
            raise ValueError(f"rules must be ordered by component; got {group}")
        rows = _rows(context, c)
        try:
            np_rule = InferredRule(group[0], _infer_number_position(group[0], rows))
        except _ContextError as exc:
            np_rule = InferredRule(group[0], error=str(exc))
        inferred.append(np_rule)
        uniform = rows[2][0].uniformity == _UNIFORM_LEVEL
        for rule in group[1:]:
            try:
                parameter, scope = _infer_entity_rule(rule, rows, np_rule, uniform)
                inferred.append(InferredRule(rule, parameter, scope))
            except _ContextError as exc:
                inferred.append(InferredRule(rule, error=str(exc)))
    return inferred


# -------------------------------------------------------------------------------------------------
# Candidate checks
# -------------------------------------------------------------------------------------------------


def _describe_set(slots: frozenset) -> str:
    return "{" + ", ".join(str(s) for s in sorted(slots)) + "}"


def _check_number_position(item: InferredRule, p31: ComponentPanel, p32: ComponentPanel, x: ComponentPanel):
    name, attr, param = item.rule.name, item.rule.attr, item.parameter
    if name == "Constant":
        ok = _set(x) == _set(p32)
        return ok, f"slots {_describe_set(_set(x))}, expected {_describe_set(_set(p32))}"
    if name == "Progression" and attr == "Number":
        expected = _count(p32) + param
        return _count(x) == expected, f"{_count(x)} entities, expected {expected}"
    if name == "Progression":
        expected = frozenset((s + param) % _n_slots(p32) for s in p32.slots)
        return _set(x) == expected, f"slots {_describe_set(_set(x))}, expected {_describe_set(expected)}"
    if name == "Arithmetic":
        if attr == "Number":
            options = {_count(p31) + _count(p32), _count(p31) - _count(p32)} if param == 0 else {
                _count(p31) + param * _count(p32)
            }
            return _count(x) in options, f"{_count(x)} entities, expected {sorted(options)}"
        plus, minus = _set(p31) | _set(p32), _set(p31) - _set(p32)
        options = {plus, minus} if param == 0 else {plus if param > 0 else minus}
        expected = " or ".join(_describe_set(o) for o in options)
        return _set(x) in options, f"slots {_describe_set(_set(x))}, expected {expected}"
    # Distribute_Three
    key = _count if attr == "Number" else _set
    remaining = set(param) - {key(p31), key(p32)}
    ok = len(remaining) == 1 and key(x) in remaining
    if attr == "Number":
        return ok, f"{_count(x)} entities, expected {sorted(remaining)}"
    return ok, f"slots {_describe_set(_set(x))}, expected " + " or ".join(_describe_set(r) for r in remaining)


def _check_entity_rule(
    item: InferredRule, np_item: InferredRule, p31: ComponentPanel, p32: ComponentPanel, x: ComponentPanel
):
    attr = item.rule.attr.lower()
    name, param = item.rule.name, item.parameter
    if name == "Constant":
        if item.scope == "free":
            return True, f"{attr} is resampled with the entities: not constrained"
        if item.scope == "uniform":
            expected = getattr(p32.entities[0], attr)
            found = sorted({getattr(e, attr) for e in x.entities})
            return found == [expected], f"{attr} levels {found}, expected [{expected}] on every entity"
        pairs = _entity_pairs(np_item, p32, x)
        if pairs is None:
            return False, "entities of column 2 are not carried over"
        bad = [(getattr(a, attr), getattr(b, attr)) for a, b in pairs if getattr(a, attr) != getattr(b, attr)]
        return not bad, "carried entities keep their " + attr + ("" if not bad else f"; changed {bad}")
    level = _level(x, attr)
    l31, l32 = _level(p31, attr), _level(p32, attr)
    if name == "Progression":
        options = {l32 + param}
    elif name == "Arithmetic":
        offset = 1 if attr == "size" else 0
        plus, minus = l31 + l32 + offset, l31 - l32 - offset
        options = {plus, minus} if param == 0 else {plus if param > 0 else minus}
    else:
        options = set(param) - {l31, l32}
    if level is None:
        found = sorted({getattr(e, attr) for e in x.entities})
        return False, f"entities have different {attr} levels {found}, expected all {sorted(options)}"
    return level in options, f"{attr} level {level}, expected {sorted(options)}"


def _check_panel(inferred: list[InferredRule], p31: Panel, p32: Panel, x: Panel) -> list[RuleCheck]:
    checks: list[RuleCheck] = []
    for c in range(len(inferred) // 4):
        a, b, cand = p31.components[c], p32.components[c], x.components[c]
        np_item = inferred[4 * c]
        for g, item in enumerate(inferred[4 * c: 4 * c + 4]):
            if item.error is not None:
                checks.append(RuleCheck(item.rule, False, f"context breaks the rule: {item.error}"))
                continue
            if g == 0:
                ok, reason = _check_number_position(item, a, b, cand)
            else:
                ok, reason = _check_entity_rule(item, np_item, a, b, cand)
            checks.append(RuleCheck(item.rule, bool(ok), reason))
    return checks


def solver_score(inferred: list[InferredRule], p31: Panel, p32: Panel, x: Panel) -> int:
    """How many rules the reference generators' heuristic solver (``solver.py``) counts as satisfied when ``x``
    completes row 3 after ``p31``, ``p32``: the score RAVEN-FAIR compares with the answer's to reject a distractor
    (docs/generator.md, "RAVEN-FAIR").

    The solver counts, per component, the Number/Position rule and the Type, Size and Color rules that ``x``
    satisfies. On a context that follows its rules its verdict equals this module's check of every rule but one
    kind: a Constant Type/Size/Color rule on the *carried* entities of a non-uniform component. There the solver
    compares entity i of ``x`` with entity i of P32 (by index, not by slot), and counts the rule as satisfied
    whenever ``x`` has another number of entities than P32 (it only looks when the counts agree).
    """
    score = 0
    for c in range(len(inferred) // 4):
        a, b, cand = p31.components[c], p32.components[c], x.components[c]
        np_item = inferred[4 * c]
        for g, item in enumerate(inferred[4 * c: 4 * c + 4]):
            if item.error is not None:
                continue
            if g == 0:
                ok, _ = _check_number_position(item, a, b, cand)
            elif item.rule.name == "Constant" and item.scope == "carried":
                attr = item.rule.attr.lower()
                ok = len(cand.entities) != len(b.entities) or all(
                    getattr(e, attr) == getattr(f, attr) for e, f in zip(cand.entities, b.entities))
            else:
                ok, _ = _check_entity_rule(item, np_item, a, b, cand)
            score += bool(ok)
    return score


def check_context(problem: Problem) -> list[RuleCheck]:
    """Whether the 8 context panels follow each rule (a parameter could be inferred consistently)."""
    return [
        RuleCheck(item.rule, item.error is None, item.error or "context follows the rule")
        for item in infer_rules(problem)
    ]


def check_candidate(problem: Problem, index: int, inferred: list[InferredRule] | None = None) -> list[RuleCheck]:
    """Check candidate ``index`` (0..7) against every rule, as the third panel of row 3."""
    if not 0 <= index < len(problem.candidates):
        raise IndexError(f"candidate index {index} out of range 0..{len(problem.candidates) - 1}")
    if inferred is None:
        inferred = infer_rules(problem)
    return _check_panel(inferred, problem.context[6], problem.context[7], problem.candidates[index])


def satisfying_candidates(problem: Problem) -> list[int]:
    """Indices of the candidates that satisfy every rule (a well-formed problem has exactly one)."""
    inferred = infer_rules(problem)
    return [
        k
        for k, candidate in enumerate(problem.candidates)
        if all(check.satisfied for check in _check_panel(inferred, problem.context[6], problem.context[7], candidate))
    ]


def explain(problem: Problem, index: int | None = None) -> str:
    """A text report: inferred parameters, then per candidate (or only ``index``) each rule's verdict."""
    inferred = infer_rules(problem)
    lines = [f"{problem.configuration}: target {problem.target}"]
    for item in inferred:
        rule = item.rule
        state = f"ERROR {item.error}" if item.error else f"parameter {item.parameter!r} {item.scope}".rstrip()
        lines.append(f"  rule c{rule.component} {rule.name} {rule.attr}: {state}")
    indices = range(len(problem.candidates)) if index is None else [index]
    for k in indices:
        checks = check_candidate(problem, k, inferred)
        verdict = "OK" if all(ch.satisfied for ch in checks) else "fails"
        lines.append(f"  candidate {k}: {verdict}")
        for ch in checks:
            mark = "+" if ch.satisfied else "-"
            lines.append(f"    {mark} c{ch.rule.component} {ch.rule.name} {ch.rule.attr}: {ch.reason}")
    return "\n".join(lines)
