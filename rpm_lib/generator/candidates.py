"""Candidate answers: RAVEN's one-attribute distractors and I-RAVEN's attribute bisection tree, plus the
shared list of modifiable attributes (``sample_attr_avail``) and the candidate modes. ``candidate_sets.make_candidates``
picks a mode's procedure (RAVEN-FAIR's is ``fair_candidates``). See docs/generator.md, "Candidate sets".

Both generators start from the answer P33 and only change attributes whose change breaks a rule *visibly*:
Number/Position always (where another value exists), Type/Size/Color when their rule is not Constant, or
when it is Constant and the entities are visibly carried along the row (uniform layout, Constant N/P rule,
Progression- or Distribute_Three-Position).

Deliberate deviations: the final shuffle uses the caller's Generator instead of Python's ``random`` module,
and rejection loops over *levels* (``sample_new`` retrying used levels) are replaced by uniform draws over
the still-allowed levels (same distribution). Loops over position sets are kept where a level and a set are
drawn jointly (RAVEN's Number distractor), because there the retry changes the level distribution.
``candidate_sets.make_candidates`` redraws a candidate set in which two candidates would render pixel-identically
(``lookalikes``; squares of Size 0.6 and 0.7 in In_Distribute_Four, ``constants.RENDER_IDENTICAL_SIZES``): the
reference generators do not, and then produce two identical images -- sometimes a distractor that looks exactly like
the answer (about 2% of RAVEN and 0.3% of I-RAVEN in_distribute_four_out_center_single problems). In
Mesh problems it also renders the candidates and redraws when two images are equal although their keys
differ (a black Mesh line lying on a black-filled shape is invisible).

Mesh problems (docs/generator.md, "Mesh"): the Mesh is one more component whose Number (levels 0..11) and
Position (only with fewer than 12 lines) are modifiable; its Type/Size/Color have one value and never are.
The balanced tree then takes a *quota*: when more than 3 attributes are modifiable, 1..(number of modifiable
Mesh attributes) of the 3 perturbed ones, uniformly, are the Mesh's, the rest other components'; the
selection is shuffled in every case (raven-datasets). Original (RAVEN) and fair (RAVEN-FAIR) candidates are not
defined for Mesh problems and are refused.

Deliberate deviation in Mesh problems (docs/generator.md, "Line counts the candidates do not give away"):
raven-datasets draws the Mesh's Number alternative uniformly over the other levels, so the distractors tend to
have more lines than the answer and the candidates alone point at it. Mode ``"balanced"`` draws it from
``mesh_balance.alternative_distribution`` (answer level and alternative level exchangeable), and asks a
Number for two position sets (I-RAVEN's "3-Position-Number") only when its *own* component's Position is
selected (the reference asks whenever any Position is; the Mesh then never gets 12 lines as an alternative
although the answer can have them). Mode ``"mesh-faithful"`` keeps raven-datasets' draws. Plain I-RAVEN is
unchanged: without the Mesh both rules coincide.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb

from rpm_lib.generator.constants import has_mesh
from rpm_lib.generator.mesh_balance import alternative_distribution
from rpm_lib.generator.problem import ComponentPanel, Panel, Rule
from rpm_lib.generator.rows import UNIFORM_LEVEL, sample_entity
from rpm_lib.generator.sampling import ComponentRanges, RandomStream

__all__ = [
    "MODES",
    "MESH_FAITHFUL",
    "FAIR",
    "check_mode",
    "ModifiableAttribute",
    "modifiable_attributes",
    "select_attributes",
    "original_candidates",
    "balanced_candidates",
]

N_CANDIDATES = 8


@dataclass
class ModifiableAttribute:
    """One attribute the candidate generators may change (a row of the reference ``sample_attr_avail``).

    Attributes:
        component: component index.
        attr: ``"Number" | "Position" | "Type" | "Size" | "Color"``.
        times: how many distinct alternative values exist (RAVEN draws at most this many).
        low, high: unpruned level range (``None`` for Position).
        uniform: I-RAVEN's ``attr_uni``: ``True`` for non-Constant rules (one alternative level for all
            entities), the layout's uniformity for Constant rules, ``None`` for Number/Position.
    """

    component: int
    attr: str
    times: int
    low: int | None
    high: int | None
    uniform: bool | None


def modifiable_attributes(
    rules: list[Rule], ranges: list[ComponentRanges], answer: Panel
) -> list[ModifiableAttribute]:
    """The attributes of ``answer`` that may be modified, in reference order (per component: Number,
    Position, Type, Size, Color)."""
    entries: list[ModifiableAttribute] = []
    for c, comp in enumerate(answer.components):
        np_rule = rules[4 * c]
        spec = ranges[c].layout
        n = len(spec.slots)
        count = len(comp.slots)
        low, high = spec.number
        number_times = sum(comb(n, level + 1) for level in range(low, high + 1) if level + 1 != count)
        if number_times > 0:
            entries.append(ModifiableAttribute(c, "Number", number_times, low, high, None))
        if np_rule.attr != "Number":
            position_times = comb(n, count) - 1
            if position_times > 0:
                entries.append(ModifiableAttribute(c, "Position", position_times, None, None, None))
        uniform = comp.uniformity == UNIFORM_LEVEL
        carried = np_rule.name == "Constant" or (
            np_rule.attr == "Position" and np_rule.name in ("Progression", "Distribute_Three")
        )
        for rule in rules[4 * c + 1: 4 * c + 4]:
            low, high = getattr(spec, rule.attr.lower())
            if high - low <= 0:
                continue
            if rule.name != "Constant":
                entries.append(ModifiableAttribute(c, rule.attr, high - low, low, high, True))
            elif uniform or carried:
                entries.append(ModifiableAttribute(c, rule.attr, high - low, low, high, uniform))
    return entries


def _shuffled(
    candidates: list[Panel], modified: list | None, s: RandomStream
) -> tuple[list[Panel], int, list | None]:
    """Shuffle; the answer must be ``candidates[0]`` on entry. Returns (candidates, target, modified)."""
    if len(candidates) != N_CANDIDATES:
        raise RuntimeError(f"candidate generation produced {len(candidates)} candidates, expected 8")
    order = list(range(N_CANDIDATES))
    s.shuffle(order)
    shuffled_modified = None if modified is None else [modified[i] for i in order]
    return [candidates[i] for i in order], order.index(0), shuffled_modified


def _new_position_set(n: int, count: int, forbidden: list[frozenset], s: RandomStream) -> list[int]:
    """A random ordered slot list of ``count`` slots whose set is not in ``forbidden``."""
    while True:
        slots = s.sample(n, count)
        if frozenset(slots) not in forbidden:
            return slots


def _number_bookkeeping(ranges: ComponentRanges) -> tuple[dict[int, int], dict[int, list[frozenset]]]:
    """Per Number level: position sets still unused by Number distractors, and the used ones."""
    n = ranges.n_slots
    low, high = ranges.layout.number
    return {level: comb(n, level + 1) for level in range(low, high + 1)}, {
        level: [] for level in range(low, high + 1)
    }


# -------------------------------------------------------------------------------------------------
# RAVEN (original, biased)
# -------------------------------------------------------------------------------------------------


def original_candidates(
    rules: list[Rule], ranges: list[ComponentRanges], answer: Panel, s: RandomStream
) -> tuple[list[Panel], int]:
    """RAVEN's candidates (docs/generator.md, "Original candidates (RAVEN)"): the answer plus 7 copies with one
    attribute changed each, shuffled.

    Returns ``(candidates, target)``. Raises ``ValueError`` for a Mesh problem (RAVEN never had a Mesh).
    """
    _refuse_mesh(ranges)
    entries = modifiable_attributes(rules, ranges, answer)
    books = [_number_bookkeeping(r) for r in ranges]
    used_positions: list[list[frozenset]] = [[frozenset(comp.slots)] for comp in answer.components]
    used_levels: dict[tuple[int, str], list[list[int]]] = {}
    candidates = [answer]
    for _ in range(N_CANDIDATES - 1):
        k = int(s.random() * len(entries))
        entry = entries[k]
        entry.times -= 1
        if entry.times == 0:
            del entries[k]
        c = entry.component
        candidate = answer.copy()
        comp = candidate.components[c]
        original = answer.components[c]
        n = ranges[c].n_slots
        if entry.attr == "Number":
            left, used = books[c]
            levels = [lv for lv in range(entry.low, entry.high + 1) if lv != original.number and left[lv] > 0]
            while True:  # the reference redraws the level too when the position set was used before
                level = s.choice(levels)
                slots = s.sample(n, level + 1)
                key = frozenset(slots)
                if key not in used[level]:
                    break
            left[level] -= 1
            used[level].append(key)
            # fresh independent entities, ignoring uniformity: the "odd" RAVEN Number distractor
            comp.slots = slots
            comp.entities = [sample_entity(ranges[c], s) for _ in slots]
        elif entry.attr == "Position":
            slots = _new_position_set(n, len(original.slots), used_positions[c], s)
            used_positions[c].append(frozenset(slots))
            comp.slots = slots
        else:
            attr = entry.attr.lower()
            previous = used_levels.setdefault((c, attr), [[] for _ in original.entities])
            for i, entity in enumerate(comp.entities):
                current = getattr(original.entities[i], attr)
                options = [v for v in range(entry.low, entry.high + 1) if v != current and v not in previous[i]]
                level = s.choice(options)
                previous[i].append(level)
                setattr(entity, attr, level)
        candidates.append(candidate)
    shuffled, target, _ = _shuffled(candidates, None, s)
    return shuffled, target


#: Candidate modes: ``"balanced"`` = I-RAVEN attribute bisection tree, ``"original"`` = RAVEN distractors,
#: ``"fair"`` = RAVEN-FAIR's tree of one-attribute changes (``fair_candidates``), ``"mesh-faithful"`` = the
#: balanced tree of a Mesh problem drawn exactly as raven-datasets draws it (its Mesh Number alternatives give the
#: answer away: docs/generator.md, "Line counts the candidates do not give away").
MESH_FAITHFUL = "mesh-faithful"
FAIR = "fair"
MODES: tuple[str, ...] = ("balanced", "original", FAIR, MESH_FAITHFUL)


def check_mode(mode: str, mesh: bool = False) -> None:
    """One-line ``ValueError`` unless ``mode`` can build the candidates of a problem with (``mesh``) or
    without the Mesh: "balanced" always, "original" and "fair" only without (RAVEN and RAVEN-FAIR never had a
    Mesh), "mesh-faithful" only with it."""
    if mode not in MODES:
        raise ValueError(f"unknown candidate mode {mode!r}; expected one of {MODES}")
    if mesh and mode in ("original", FAIR):
        name = "original (RAVEN)" if mode == "original" else "fair (RAVEN-FAIR)"
        raise ValueError(
            f"{name} candidates are not defined for a Mesh problem: the I-RAVEN-Mesh generator "
            "builds only balanced (I-RAVEN) candidates; use mode='balanced'"
        )
    if not mesh and mode == MESH_FAITHFUL:
        raise ValueError(
            "mode 'mesh-faithful' (raven-datasets' Mesh Number alternatives) needs the Mesh (--mesh / regime "
            "I-RAVEN-Mesh); without it the balanced candidates already are I-RAVEN's: use mode='balanced'"
        )


def _refuse_mesh(ranges: list[ComponentRanges]) -> None:
    check_mode("original", has_mesh(r.layout.name for r in ranges))


# -------------------------------------------------------------------------------------------------
# I-RAVEN (balanced)
# -------------------------------------------------------------------------------------------------


N_PERTURBED = 3


def select_attributes(
    entries: list[ModifiableAttribute], mesh_component: int | None, s: RandomStream
) -> list[ModifiableAttribute]:
    """The (up to) 3 attributes the balanced tree perturbs, before "Number goes last".

    Without a Mesh (``mesh_component`` None): 3 distinct entries in uniformly random order, or all of them
    when fewer than 3 (I-RAVEN). With a Mesh at component ``mesh_component``: when more than 3 entries,
    ``m`` ~ U{1..#Mesh entries} Mesh entries and ``3 - m`` others, each drawn without replacement; else all
    entries; then shuffled (raven-datasets' quota, docs/generator.md "Mesh").
    """
    if mesh_component is None:
        if len(entries) >= N_PERTURBED:
            return [entries[i] for i in s.sample(len(entries), N_PERTURBED)]
        return list(entries)
    if len(entries) > N_PERTURBED:
        mesh = [e for e in entries if e.component == mesh_component]
        rest = [e for e in entries if e.component != mesh_component]
        if not mesh:
            raise RuntimeError("Mesh problem without a modifiable Mesh attribute (its Number always is)")
        m = s.integer(1, len(mesh))
        if N_PERTURBED - m > len(rest):
            raise RuntimeError(f"Mesh quota: {N_PERTURBED - m} other attributes wanted, {len(rest)} modifiable")
        selected = [mesh[i] for i in s.sample(len(mesh), m)]
        selected += [rest[i] for i in s.sample(len(rest), N_PERTURBED - m)]
    else:
        selected = list(entries)
    s.shuffle(selected)
    return selected


class _AlternativeSampler:
    """Draws alternative values from the answer (I-RAVEN ``sample_new_value``), with its Number bookkeeping:
    each Number level is used once before any repeats (``num_count``), and no position set twice."""

    def __init__(self, ranges: list[ComponentRanges], answer: Panel, s: RandomStream, mesh_levels=None) -> None:
        self.ranges = ranges
        self.answer = answer
        self.s = s
        # (component, probabilities(levels) -> list | None): the Mesh's answer-blind Number draw (mesh_balance)
        self.mesh_levels = mesh_levels
        self.books = [_number_bookkeeping(r) for r in ranges]
        self.level_fresh = [{level: True for level in book[0]} for book in self.books]

    def sample(self, entry: ModifiableAttribute, three_position_number: bool):
        s = self.s
        c = entry.component
        original = self.answer.components[c]
        n = self.ranges[c].n_slots
        if entry.attr == "Number":
            left, used = self.books[c]
            fresh = self.level_fresh[c]
            levels = [
                lv
                for lv in range(entry.low, entry.high + 1)
                if lv != original.number and fresh[lv] and not (three_position_number and left[lv] == 1)
            ]
            if not levels:
                raise RuntimeError("I-RAVEN Number alternative: no admissible Number level left")
            probabilities = None
            if self.mesh_levels is not None and c == self.mesh_levels[0] and all(fresh.values()):
                probabilities = self.mesh_levels[1](levels)
            if probabilities is None:
                level = s.choice(levels)
            else:  # one uniform, like choice
                u, k, acc = s.random(), 0, probabilities[0]
                while u >= acc and k < len(levels) - 1:
                    k += 1
                    acc += probabilities[k]
                level = levels[k]
            fresh[level] = False
            new_count, old_count = level + 1, len(original.entities)
            if old_count >= new_count:
                select = s.sample(old_count, new_count)
            else:  # all existing entities as often as they fit, then a random subset
                select, rest = [], new_count
                while old_count < rest:
                    select.extend(range(old_count))
                    rest -= old_count
                select.extend(s.sample(old_count, rest))
            position_sets = []
            for _ in range(2 if three_position_number else 1):
                slots = _new_position_set(n, new_count, used[level], s)
                left[level] -= 1
                used[level].append(frozenset(slots))
                position_sets.append(slots)
            # the answer's own level is never drawn, so "one fresh level left" means all others were used
            if sum(fresh.values()) == 1:
                for lv in fresh:
                    if left[lv] > 0:
                        fresh[lv] = True
            return level, select, position_sets
        if entry.attr == "Position":
            return _new_position_set(n, len(original.slots), [frozenset(original.slots)], s)
        attr = entry.attr.lower()
        levels = range(entry.low, entry.high + 1)
        if entry.uniform:
            current = getattr(original.entities[0], attr)
            return [s.choice([v for v in levels if v != current])]
        return [s.choice([v for v in levels if v != getattr(e, attr)]) for e in original.entities]


def _apply_alternative(
    candidate: Panel, entry: ModifiableAttribute, value, path: list[tuple[int, str]]
) -> None:
    """Put an alternative value into ``candidate`` (in place); ``path`` = its modifications so far."""
    comp: ComponentPanel = candidate.components[entry.component]
    if entry.attr == "Number":
        level, select, position_sets = value
        # in 3-Position-Number mode, candidates whose Position was changed take the second set
        use_second = len(position_sets) == 2 and (entry.component, "Position") in path
        slots = position_sets[1] if use_second else position_sets[0]
        comp.entities = [comp.entities[i].copy() for i in select]
        comp.slots = list(slots)
    elif entry.attr == "Position":
        comp.slots = list(value)
    else:
        attr = entry.attr.lower()
        for i, entity in enumerate(comp.entities):
            setattr(entity, attr, value[i % len(value)])


def balanced_candidates(
    rules: list[Rule], ranges: list[ComponentRanges], answer: Panel, s: RandomStream, faithful: bool = False
) -> tuple[list[Panel], int, list[list[tuple[int, str]]]]:
    """I-RAVEN's candidates (docs/generator.md, "Balanced candidates (I-RAVEN)"): corners of the cube over (up
    to) 3 modified attributes, shuffled.

    Returns ``(candidates, target, modified)``; ``modified[k]`` lists the (component, attribute) pairs
    changed on candidate k's tree path (``[]`` for the answer), as the .xml ``Modified_attributes``.
    In a Mesh problem ``faithful`` keeps raven-datasets' Mesh Number alternatives (uniform, and two position
    sets whenever any Position is selected); otherwise they are answer-blind (module docstring).
    """
    entries = modifiable_attributes(rules, ranges, answer)
    mesh_component = len(ranges) - 1 if has_mesh(r.layout.name for r in ranges) else None
    selected = select_attributes(entries, mesh_component, s)
    position_number = False
    numbers = [i for i, e in enumerate(selected) if e.attr == "Number"]
    if numbers:  # Number goes last: its alternatives copy entities, so earlier changes must be in place
        i = numbers[0]
        selected[i], selected[-1] = selected[-1], selected[i]
        position_number = any(e.attr == "Position" for e in selected)
        if mesh_component is not None:
            # Deliberate deviation: with the Mesh two Numbers (a grid's and the Mesh's) can be selected and
            # the swap above moves only one, so a Number could precede its own component's Position, which
            # then moves the answer's count of slots onto a different count of entities (the reference
            # writes such inconsistent candidates). A stable partition puts every Number after the rest.
            selected.sort(key=lambda e: e.attr == "Number")
    mesh_levels = None
    own_position = None
    if mesh_component is not None and not faithful:
        mesh_levels = (mesh_component, _mesh_number_draw(rules, ranges, answer, entries, selected, mesh_component))
        own_position = {e.component for e in selected if e.attr == "Position"}
    sampler = _AlternativeSampler(ranges, answer, s, mesh_levels)
    candidates = [answer]
    paths: list[list[tuple[int, str]]] = [[]]

    def branch(source: int, entry: ModifiableAttribute, value) -> None:
        new = candidates[source].copy()
        _apply_alternative(new, entry, value, paths[source])
        candidates.append(new)
        paths.append(paths[source] + [(entry.component, entry.attr)])

    if len(selected) >= 3:
        for entry in selected:
            two_sets = position_number if own_position is None else entry.component in own_position
            value = sampler.sample(entry, two_sets)
            for j in range(len(candidates)):
                branch(j, entry, value)
    elif len(selected) == 2:
        first, second = selected
        if second.attr != "Number":
            raise RuntimeError(f"I-RAVEN two-attribute case expects Number last, got {second.attr}")
        branch(0, first, sampler.sample(first, False))
        repeats, sources = (6, 1) if position_number else (3, 2)
        for _ in range(repeats):
            value = sampler.sample(second, False)
            for j in range(sources):
                branch(j, second, value)
    elif len(selected) == 1:
        for _ in range(N_CANDIDATES - 1):
            branch(0, selected[0], sampler.sample(selected[0], False))
    else:
        raise RuntimeError("no modifiable attribute: cannot build I-RAVEN candidates")
    shuffled, target, modified = _shuffled(candidates, paths, s)
    return shuffled, target, modified


def _mesh_number_draw(rules, ranges, answer, entries, selected, mesh_component):
    """The probabilities of the Mesh's Number alternative over the admissible levels (``mesh_balance``), or
    a function returning ``None`` (uniform draw) where no answer-blind pairing exists."""
    rule = rules[4 * mesh_component]
    start = ranges[mesh_component].number
    answer_level = answer.components[mesh_component].number
    n_rest = sum(e.component != mesh_component for e in entries)
    mesh_attrs = frozenset(e.attr for e in selected if e.component == mesh_component)
    rest_selected = sum(e.component != mesh_component for e in selected)

    def draw(levels: list[int]) -> list[float] | None:
        if len(selected) < N_PERTURBED:  # the tree draws several Number values (never seen with the Mesh)
            return None
        return alternative_distribution(rule, start, answer_level, n_rest, mesh_attrs, rest_selected, levels)

    return draw
