"""Matrix (row) generation: the 3x3 panels of a problem from its rules.

See docs/generator.md, "The first panel", "Row generation" and "Quirks kept on purpose".

Per component (components never interact, so each is generated on its own):

- Uniformity level ~ U{0..3} once per problem (3 = uniform: all entities of a panel are copies of one).
- Row 1 starts from a freshly sampled first panel; rows 2 and 3 from fully resampled ones (new Number level
  from the pruned range, new positions, new entities).
- The Number/Position rule builds columns 2 and 3 from column 1; then the Type, Size and Color rules set
  their attribute on columns 1-3 (column 1 may be changed in place: consistency enforcement of
  Progression/Arithmetic in non-uniform layouts, Distribute_Three overwrites).

Every quirk of the reference Rule.py is kept because each changes the distribution: Distribute_Three row
permutations (1/2 each) and first-column overwrites (Number, Position, Type/Size/Color); "entity
regeneration" under Number-changing rules (copies of the previous panel's first entity, fully resampled in
non-uniform layouts); the Arithmetic ranges for column 2 and the set-acceptance tests of
Arithmetic-Position; the Arithmetic-Color "white alarm" (rows 1 and 2 cannot both have level 0 in column 2).

The Mesh (docs/generator.md, "Mesh") is one more component generated the same way, with two reference
quirks: a Progression on its Position turns the whole mesh by 3 slots (90 degrees) per column whatever the
step size (``constants.progression_position_shift``), and every freshly sampled count -- the first panel of
each row, the Arithmetic second column -- is clamped at ``FRESH_NUMBER_MAX_LEVEL`` (9 lines) while counts
made by the rules (Progression, Arithmetic third column, Distribute_Three values, union) reach 12.

Deliberate deviations (no effect on the distribution of any panel): rows are built column-by-column
directly (e.g. a Distribute_Three first column is sampled with its prescribed count instead of being
resampled and overwritten), and components are generated one after the other instead of interleaved.
"""
from __future__ import annotations

from rpm_lib.generator.constants import (
    COLOR_MAX_LEVEL,
    FRESH_NUMBER_MAX_LEVEL,
    configuration_components,
    progression_position_shift,
)
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel, Rule
from rpm_lib.generator.sampling import ComponentRanges, RandomStream

__all__ = ["UNIFORM_LEVEL", "fresh_number_range", "sample_entity", "generate_component_rows", "generate_matrix"]

#: Uniformity level meaning "uniform" (``UNI_VALUES[3] is True``).
UNIFORM_LEVEL = 3


def fresh_number_range(ranges: ComponentRanges) -> tuple[int, int]:
    """Inclusive Number-level range of a freshly sampled count: the pruned range clamped at
    ``FRESH_NUMBER_MAX_LEVEL`` (the reference's ``NUM_MAX``; changes nothing below 10 slots)."""
    low, high = ranges.number
    return low, min(high, FRESH_NUMBER_MAX_LEVEL)


def sample_entity(ranges: ComponentRanges, s: RandomStream) -> Entity:
    """A fresh entity: Type/Size/Color uniform over the pruned ranges, Angle uniform over the layout's
    angle levels (all 8 for shapes). A Mesh line is always Type 6, Size/Color/Angle 0."""
    if ranges.layout.lines:
        # A Mesh line has one possible value of every attribute: nothing to draw (a plain shape layout
        # still draws its single-valued attributes, so that its random stream is unchanged).
        return Entity(ranges.type[0], ranges.size[0], ranges.color[0], ranges.layout.angle[0])
    r = s.random
    t0, t1 = ranges.type
    z0, z1 = ranges.size
    c0, c1 = ranges.color
    a0, a1 = ranges.layout.angle
    return Entity(
        t0 + int(r() * (t1 - t0 + 1)),
        z0 + int(r() * (z1 - z0 + 1)),
        c0 + int(r() * (c1 - c0 + 1)),
        a0 + int(r() * (a1 - a0 + 1)),
    )


def _fresh_panel(
    ranges: ComponentRanges, uniformity: int, slots: list[int], s: RandomStream
) -> ComponentPanel:
    """A panel with new entities on ``slots`` (uniform layouts: one entity copied to every slot)."""
    if uniformity == UNIFORM_LEVEL or ranges.layout.lines:  # Mesh lines are all alike: no draws either way
        first = sample_entity(ranges, s)
        entities = [first] + [first.copy() for _ in range(len(slots) - 1)]
    else:
        entities = [sample_entity(ranges, s) for _ in slots]
    return ComponentPanel(ranges.layout.name, uniformity, slots, entities)


def _random_panel(
    ranges: ComponentRanges, uniformity: int, s: RandomStream, level: int | None = None
) -> ComponentPanel:
    """A fully (re)sampled panel; Number level uniform over the fresh range (``fresh_number_range``) unless
    ``level`` is given."""
    if level is None:
        level = s.integer(*fresh_number_range(ranges))
    return _fresh_panel(ranges, uniformity, s.sample(ranges.n_slots, level + 1), s)


def _regenerate(
    previous: ComponentPanel, slots: list[int], ranges: ComponentRanges, s: RandomStream
) -> ComponentPanel:
    """Entities for a Number-changing rule: copies of ``previous``'s first entity on ``slots``; in a
    non-uniform layout every copy is then fully resampled (Type/Size/Color/Angle)."""
    if previous.uniformity == UNIFORM_LEVEL:
        first = previous.entities[0]
        entities = [first.copy() for _ in slots]
    else:
        entities = [sample_entity(ranges, s) for _ in slots]
    return ComponentPanel(previous.layout, previous.uniformity, slots, entities)


def _moved(panel: ComponentPanel, slots: list[int]) -> ComponentPanel:
    """A copy of ``panel`` whose entity i moves to ``slots[i]`` (entities keep all attributes)."""
    return ComponentPanel(panel.layout, panel.uniformity, slots, [e.copy() for e in panel.entities])


def _d3_row_orders(s: RandomStream) -> tuple[tuple[int, int, int], ...]:
    """Index orders of the Distribute_Three value triple per row: row 1 (a,b,c), rows 2/3 the two cyclic
    shifts in random order."""
    if s.coin():
        return (0, 1, 2), (1, 2, 0), (2, 0, 1)
    return (0, 1, 2), (2, 0, 1), (1, 2, 0)


def _number_position_rows(
    rule: Rule, ranges: ComponentRanges, uniformity: int, s: RandomStream
) -> list[list[ComponentPanel]]:
    """Apply the Number/Position rule: 3 rows x 3 columns of panels (entities not yet ruled)."""
    n = ranges.n_slots
    name, attr, value = rule.name, rule.attr, rule.value
    rows: list[list[ComponentPanel]] = []

    if name == "Distribute_Three":
        first = _random_panel(ranges, uniformity, s)
        orders = _d3_row_orders(s)
        if attr == "Number":
            a = first.number
            others = [level for level in range(ranges.number[0], ranges.number[1] + 1) if level != a]
            pick = s.sample(len(others), 2)
            triple = (a, others[pick[0]], others[pick[1]])
            for row, order in enumerate(orders):
                levels = [triple[k] for k in order]
                p1 = first if row == 0 else _random_panel(ranges, uniformity, s, levels[0])
                p2 = _regenerate(p1, s.sample(n, levels[1] + 1), ranges, s)
                p3 = _regenerate(p2, s.sample(n, levels[2] + 1), ranges, s)
                rows.append([p1, p2, p3])
        else:  # Position: three distinct position sets of the row-1 count
            count = len(first.slots)
            sets = [list(first.slots)]
            seen = [frozenset(first.slots)]
            while len(sets) < 3:
                candidate = s.sample(n, count)
                key = frozenset(candidate)
                if key not in seen:
                    sets.append(candidate)
                    seen.append(key)
            for row, order in enumerate(orders):
                p1 = first if row == 0 else _fresh_panel(ranges, uniformity, list(sets[order[0]]), s)
                p2 = _moved(p1, list(sets[order[1]]))
                p3 = _moved(p2, list(sets[order[2]]))
                rows.append([p1, p2, p3])
        return rows

    for row in range(3):
        p1 = _random_panel(ranges, uniformity, s)
        if name == "Constant":
            p2 = _moved(p1, list(p1.slots))
            p3 = _moved(p2, list(p2.slots))
        elif name == "Progression" and attr == "Number":
            p2 = _regenerate(p1, s.sample(n, p1.number + value + 1), ranges, s)
            p3 = _regenerate(p2, s.sample(n, p2.number + value + 1), ranges, s)
        elif name == "Progression":  # Position: every occupied slot index shifts (mod n); Mesh: +-3
            shift = progression_position_shift(ranges.layout.name, value)
            p2 = _moved(p1, [(i + shift) % n for i in p1.slots])
            p3 = _moved(p2, [(i + shift) % n for i in p2.slots])
        elif attr == "Number":  # Arithmetic on counts: count3 = count1 +- count2
            l1 = p1.number
            low, high = ranges.layout.number
            # column 2 is a fresh sample, so it is clamped like a first column
            if value > 0:
                l2 = s.integer(ranges.number[0], min(high - l1 - 1, FRESH_NUMBER_MAX_LEVEL))
                l3 = l1 + l2 + 1
            else:
                l2 = s.integer(low, min(l1 - low - 1, FRESH_NUMBER_MAX_LEVEL))
                l3 = l1 - l2 - 1
            p2 = _regenerate(p1, s.sample(n, l2 + 1), ranges, s)
            p3 = _regenerate(p2, s.sample(n, l3 + 1), ranges, s)
        else:  # Arithmetic on positions: union (+) or difference (-) of the occupied slot sets
            set1 = set(p1.slots)
            while True:
                slots2 = s.sample(n, s.integer(*fresh_number_range(ranges)) + 1)
                set2 = set(slots2)
                # union: column 2 must add something; difference: something must be left
                if (value > 0 and not set2 <= set1) or (value < 0 and not set1 <= set2):
                    break
            set3 = set1 | set2 if value > 0 else set1 - set2
            p2 = _regenerate(p1, slots2, ranges, s)
            p3 = _regenerate(p2, sorted(set3), ranges, s)
        rows.append([p1, p2, p3])
    return rows


def _set_all(panel: ComponentPanel, attr: str, level: int) -> None:
    for entity in panel.entities:
        setattr(entity, attr, level)


def _apply_entity_rule(
    rule: Rule, rows: list[list[ComponentPanel]], ranges: ComponentRanges, s: RandomStream
) -> None:
    """Apply a Type/Size/Color rule in place to the 3x3 panels of one component."""
    name, value = rule.name, rule.value
    if name == "Constant":
        return
    attr = rule.attr.lower()
    low, high = getattr(ranges, attr)

    if name == "Distribute_Three":
        pick = s.sample(high - low + 1, 3)
        triple = [low + k for k in pick]
        for row, order in zip(rows, _d3_row_orders(s)):
            for panel, k in zip(row, order):
                _set_all(panel, attr, triple[k])
        return

    alarm = False  # Arithmetic-Color: row 1 had level 0 in column 2
    for r, (p1, p2, p3) in enumerate(rows):
        uniform = p1.uniformity == UNIFORM_LEVEL
        l1 = getattr(p1.entities[0], attr)
        if name == "Progression":
            if not uniform:
                _set_all(p1, attr, l1)  # consistency: column 1 takes its first entity's value
            _set_all(p2, attr, l1 + value)
            _set_all(p3, attr, l1 + 2 * value)
            continue
        if attr == "size":
            if value > 0:
                l2 = s.integer(low, ranges.layout.size[1] - l1 - 1)
                l3 = l1 + l2 + 1
            else:
                m = (low - 1) // 2
                l2 = s.integer(m, l1 - m - 1)
                l3 = l1 - l2 - 1
            if not uniform:
                _set_all(p1, attr, l1)
        else:  # Arithmetic Color, on levels: column 3 = column 1 +- column 2
            reset = False
            if r == 1 and alarm and ((value > 0 and l1 == COLOR_MAX_LEVEL) or (value < 0 and l1 == 0)):
                # column 2 of row 2 must be able to be non-zero: draw another first-column level
                l1 = s.choice([c for c in range(low, high + 1) if c != l1])
                reset = True
            if reset or not uniform:
                _set_all(p1, attr, l1)
            lo2, hi2 = (low, low + high - l1) if value > 0 else (low // 2, l1)
            l2 = s.integer(lo2, hi2)
            if r == 0:
                alarm = l2 == 0
            elif r == 1 and alarm and l2 == 0:
                l2 = s.choice([c for c in range(lo2, hi2 + 1) if c != 0])
            l3 = l1 + l2 if value > 0 else l1 - l2
        _set_all(p2, attr, l2)
        _set_all(p3, attr, l3)


def generate_component_rows(
    rules: list[Rule], ranges: ComponentRanges, s: RandomStream
) -> list[list[ComponentPanel]]:
    """The 3x3 panels of one component from its 4 rules (N/P, Type, Size, Color); ``[2][2]`` is the answer."""
    uniformity = s.integer(*ranges.layout.uniformity)
    rows = _number_position_rows(rules[0], ranges, uniformity, s)
    for rule in rules[1:]:
        _apply_entity_rule(rule, rows, ranges, s)
    return rows


def generate_matrix(
    configuration: str, rules: list[Rule], ranges: list[ComponentRanges], s: RandomStream
) -> list[Panel]:
    """The 9 panels P11..P33 (row-major) of a problem; the last one is the answer.

    ``ranges`` holds one entry per component: the configuration's, plus the Mesh last in a Mesh problem;
    ``rules`` 4 per component, in component order.
    """
    n_components = len(ranges)
    expected = [layout for _, layout in configuration_components(configuration, mesh=True)]
    layouts = [r.layout.name for r in ranges]
    if layouts not in (expected[:-1], expected):
        raise ValueError(f"{configuration}: component layouts {layouts}, expected {expected[:-1]} (+ the Mesh)")
    if len(rules) != 4 * n_components:
        raise ValueError(f"{configuration}: {len(rules)} rules for {n_components} component(s), expected 4 each")
    per_component = [
        generate_component_rows(rules[4 * c: 4 * c + 4], ranges[c], s) for c in range(n_components)
    ]
    return [
        Panel([grid[r][col] for grid in per_component]) for r in range(3) for col in range(3)
    ]
