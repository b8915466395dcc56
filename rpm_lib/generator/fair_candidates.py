"""RAVEN-FAIR's candidates (Benny, Pekar & Wolf, "Scale-Localized Abstract Reasoning", CVPR 2021; the reference is
``fair_raven`` in yanivbenny/RAVEN_FAIR ``src/main.py``): a tree of one-attribute changes grown from the answer.
See docs/generator.md, "RAVEN-FAIR".

The procedure, as the reference runs it:

1. The answer is the first candidate; its list of modifiable attributes is RAVEN's
   (``candidates.modifiable_attributes``, the reference's ``sample_attr_avail``), each entry with a count ``times``
   of alternatives.
2. Until there are 8 candidates: pick uniformly one of the candidates whose list is not empty (the *parent*); pick an
   entry of its list uniformly by index and decrement its ``times`` (dropping it at zero; RAVEN's ``sample_attr``);
   copy the parent and change that one attribute the way RAVEN changes the answer (``AoT.sample_new``, relative to the
   parent). The new candidate's list is recomputed from the new candidate, less every attribute *name* changed on its
   path from the answer (the *blacklist*).
3. The new candidate is thrown away when the reference's heuristic solver scores it at least as high as the answer
   (``validity.solver_score``), or when it would look exactly like an existing candidate (``lookalikes.rendered_key``:
   equal keys are equal images); the parent's ``times`` stay decremented. (In generated problems no draw reaches the
   answer's score: every change breaks the rule of the attribute it changes. The check is kept as the reference has it.)
4. The 8 candidates are shuffled.

RAVEN's change remembers what it drew, and the reference keeps that memory on the scene trees it deep-copies, so a
candidate inherits its parent's memory as it was when the candidate was copied (:class:`_Memory`): a Position change
avoids the slot sets of the parent's earlier Position changes, a Type/Size/Color change gives each entity a level its
own earlier changes did not, a Number change a slot set no earlier Number change of that count used. A draw with no
value left fails (the reference runs into its 5-second timeout or an empty ``np.random.choice``) and the loop goes
on. Fresh entities of a Number change are drawn from the pruned ranges, as in RAVEN
(``candidates.original_candidates``).

Deliberate deviations: randomness comes from the caller's stream (``sampling.RandomStream``), rejection loops over
levels are uniform draws over the allowed levels (same distribution); where every candidate has run out of modifiable
attributes before there are 8 (the reference raises and the run stops; never seen here) ``candidate_sets.make_candidates``
draws the candidate set again. Mesh problems are refused (RAVEN-FAIR never had a Mesh).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb

from rpm_lib.generator.candidates import FAIR, N_CANDIDATES, ModifiableAttribute, check_mode, modifiable_attributes
from rpm_lib.generator.constants import has_mesh
from rpm_lib.generator.lookalikes import rendered_key
from rpm_lib.generator.problem import Panel, Rule
from rpm_lib.generator.rows import sample_entity
from rpm_lib.generator.sampling import ComponentRanges, RandomStream
from rpm_lib.generator.validity import infer_context_rules, solver_score

__all__ = ["FairTree", "NoCandidateToGrow", "REJECTIONS", "fair_candidates"]

#: Why a drawn candidate was thrown away (keys of ``FairTree.rejected``): the solver scores it as high as the
#: answer; it looks like an existing candidate; its attribute had no value left (the draw failed).
REJECTIONS = ("rules", "duplicate", "exhausted")


@dataclass
class FairTree:
    """How RAVEN-FAIR's candidates were grown, indexed like the final (shuffled) candidates. The files do not store
    it (the reference writes RAVEN's files); ``api.generate_problem`` keeps it in ``problem.extra["fair_tree"]``.

    Attributes:
        parents: per candidate, the index of the candidate it was made from; -1 for the answer.
        modified: per candidate, the (component, attribute) pairs changed on its path from the answer, in order
            (empty for the answer); the last pair is its one change from its parent.
        rejected: per reason of :data:`REJECTIONS`, how many drawn candidates were thrown away.
    """

    parents: list[int]
    modified: list[list[tuple[int, str]]]
    rejected: dict[str, int]

    @property
    def depths(self) -> list[int]:
        """Per candidate, its number of changes from the answer (0 for the answer)."""
        return [len(path) for path in self.modified]


class NoCandidateToGrow(RuntimeError):
    """Fewer than 8 candidates, and none of them has a modifiable attribute left."""


@dataclass
class _Memory:
    """What RAVEN's change remembers, per component: Number levels -> slot sets still unused and the used ones
    (``sample_new_num_count``), the slot sets of earlier Position changes, and per entity the levels earlier
    Type/Size/Color changes gave it (``previous_values``)."""

    number_left: list[dict[int, int]]
    number_used: list[dict[int, list[frozenset]]]
    positions: list[list[frozenset]]
    levels: list[list[dict[str, list[int]]]]

    @classmethod
    def fresh(cls, ranges: list[ComponentRanges], answer: Panel) -> "_Memory":
        levels = [range(r.layout.number[0], r.layout.number[1] + 1) for r in ranges]  # the unpruned Number levels
        return cls(
            [{lv: comb(r.n_slots, lv + 1) for lv in lvs} for r, lvs in zip(ranges, levels)],
            [{lv: [] for lv in lvs} for lvs in levels],
            [[] for _ in ranges],
            [[{} for _ in comp.entities] for comp in answer.components],
        )

    def copy(self) -> "_Memory":
        return _Memory(
            [dict(left) for left in self.number_left],
            [{lv: list(sets) for lv, sets in used.items()} for used in self.number_used],
            [list(sets) for sets in self.positions],
            [[{attr: list(v) for attr, v in entity.items()} for entity in comp] for comp in self.levels],
        )


@dataclass
class _Node:
    """One candidate while the tree grows: its panel, its own modifiable entries (``times`` count down as it is
    picked), the attribute names on its path, the path, its parent and its memory."""

    panel: Panel
    entries: list[ModifiableAttribute]
    blacklist: frozenset[str]
    path: list[tuple[int, str]]
    parent: int
    memory: _Memory


def _take(entries: list[ModifiableAttribute], s: RandomStream) -> ModifiableAttribute:
    """RAVEN's ``sample_attr``: an entry uniformly by index; its ``times`` drop by one, and at zero it leaves."""
    k = int(s.random() * len(entries))
    entry = entries[k]
    entry.times -= 1
    if entry.times == 0:
        del entries[k]
    return entry


def _open_sets(n: int, size: int, forbidden) -> int:
    """How many slot sets of ``size`` of ``n`` slots are not in ``forbidden`` (sets of any size)."""
    return comb(n, size) - len({f for f in forbidden if len(f) == size})


def _slot_set(n: int, size: int, forbidden: set, s: RandomStream) -> list[int]:
    """A random ordered slot list whose set is not in ``forbidden``; at least one such set must exist."""
    while True:
        slots = s.sample(n, size)
        if frozenset(slots) not in forbidden:
            return slots


def _changed(parent: _Node, child_memory: _Memory, entry: ModifiableAttribute, ranges: list[ComponentRanges],
             s: RandomStream) -> Panel | None:
    """A copy of the parent with ``entry``'s attribute changed (``AoT.sample_new`` relative to the parent), or None
    when no value is left. The draw is recorded in the parent's memory; ``child_memory`` is the parent's memory from
    before the draw (the reference copies the parent first), which the new candidate inherits."""
    c = entry.component
    panel = parent.panel.copy()
    comp = panel.components[c]
    memory = parent.memory
    n = ranges[c].n_slots
    own = {frozenset(comp.slots), *child_memory.positions[c]}  # what Position.sample_new avoids on the copy
    if entry.attr == "Number":
        left, used = memory.number_left[c], memory.number_used[c]
        levels = [lv for lv in range(entry.low, entry.high + 1) if lv != comp.number and left[lv] > 0]
        if not any(_open_sets(n, lv + 1, own | set(used[lv])) > 0 for lv in levels):
            return None
        while True:  # a used slot set sends the reference back to drawing the level, which changes its distribution
            level = s.choice(levels)
            if _open_sets(n, level + 1, own) == 0:
                return None  # the reference's inner loop over slot sets never ends: its timeout
            slots = _slot_set(n, level + 1, own, s)
            if frozenset(slots) not in used[level]:
                break
        left[level] -= 1
        used[level].append(frozenset(slots))
        # fresh independent entities that ignore uniformity (RAVEN's "odd" Number distractor), with empty memories
        comp.slots = slots
        comp.entities = [sample_entity(ranges[c], s) for _ in slots]
        child_memory.levels[c] = [{} for _ in slots]
    elif entry.attr == "Position":
        if _open_sets(n, len(comp.slots), own) == 0:
            return None
        comp.slots = _slot_set(n, len(comp.slots), own, s)
        memory.positions[c].append(frozenset(comp.slots))
    else:
        attr = entry.attr.lower()
        for i, entity in enumerate(comp.entities):
            current = getattr(entity, attr)
            previous = child_memory.levels[c][i].get(attr, ())
            options = [v for v in range(entry.low, entry.high + 1) if v != current and v not in previous]
            if not options:
                return None  # the reference's np.random.choice([]) raises; earlier entities keep their records
            level = s.choice(options)
            memory.levels[c][i].setdefault(attr, []).append(level)
            setattr(entity, attr, level)
    return panel


def fair_candidates(
    rules: list[Rule], ranges: list[ComponentRanges], answer: Panel, context: list[Panel], s: RandomStream
) -> tuple[list[Panel], int, FairTree]:
    """RAVEN-FAIR's 8 candidates for ``answer`` (P33 of a matrix whose 8 ``context`` panels follow ``rules``).

    Returns ``(candidates, target, tree)``: the shuffled candidates, the answer's index, and how the tree grew
    (:class:`FairTree`). Raises ``ValueError`` for a Mesh problem and :class:`NoCandidateToGrow` when every candidate
    runs out of modifiable attributes before there are 8.
    """
    check_mode(FAIR, has_mesh(r.layout.name for r in ranges))
    inferred = infer_context_rules(context, rules)
    p31, p32 = context[6], context[7]
    answer_score = solver_score(inferred, p31, p32, answer)
    nodes = [_Node(answer, modifiable_attributes(rules, ranges, answer), frozenset(), [], -1,
                   _Memory.fresh(ranges, answer))]
    keys = {rendered_key(answer)}
    rejected = dict.fromkeys(REJECTIONS, 0)
    while len(nodes) < N_CANDIDATES:
        growing = [k for k, node in enumerate(nodes) if node.entries]
        if not growing:
            raise NoCandidateToGrow(f"RAVEN-FAIR candidates: {len(nodes)} candidates and none can be changed further")
        index = s.choice(growing)  # the reference: the first in a random order that can grow
        parent = nodes[index]
        entry = _take(parent.entries, s)
        memory = parent.memory.copy()
        panel = _changed(parent, memory, entry, ranges, s)
        if panel is None:
            rejected["exhausted"] += 1
            continue
        if solver_score(inferred, p31, p32, panel) >= answer_score:
            rejected["rules"] += 1
            continue
        key = rendered_key(panel)
        if key in keys:
            rejected["duplicate"] += 1
            continue
        keys.add(key)
        blacklist = parent.blacklist | {entry.attr}  # by name: a Color change bars Color in every component below
        entries = [e for e in modifiable_attributes(rules, ranges, panel) if e.attr not in blacklist]
        nodes.append(_Node(panel, entries, blacklist, parent.path + [(entry.component, entry.attr)], index, memory))
    order = list(range(N_CANDIDATES))
    s.shuffle(order)
    where = {old: new for new, old in enumerate(order)}
    tree = FairTree(
        parents=[-1 if nodes[old].parent < 0 else where[nodes[old].parent] for old in order],
        modified=[nodes[old].path for old in order],
        rejected=rejected,
    )
    return [nodes[old].panel for old in order], where[0], tree
