"""Candidate answers: I-RAVEN's cube and RAVEN's one-attribute distractors (docs/generator.md, "Candidate sets")."""
from __future__ import annotations

import gc
from collections import Counter
from itertools import combinations

import numpy as np
import pytest
from scipy.stats import chisquare

from rpm_lib.generator import render
from rpm_lib.generator.api import generate_problems
from rpm_lib.generator.candidates import balanced_candidates, modifiable_attributes
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel, Problem, Rule
from rpm_lib.generator.sampling import pruned_ranges
from rpm_lib.rules import CONFIGURATIONS

PER_CONFIGURATION = 2000  # streamed: only counts are kept
STORED_PER_CONFIGURATION = 500  # kept in memory for the per-candidate checks
GRIDS = ("distribute_four", "distribute_nine")


def stored(mode: str, seed: int) -> dict[str, list[Problem]]:
    # the cyclic GC rescans every kept object at each collection; pausing it makes this 3x faster
    enabled = gc.isenabled()
    gc.disable()
    try:
        return {c: list(generate_problems(c, STORED_PER_CONFIGURATION, seed=seed, mode=mode)) for c in CONFIGURATIONS}
    finally:
        if enabled:
            gc.enable()


@pytest.fixture(scope="module")
def balanced() -> dict[str, list[Problem]]:
    return stored("balanced", 21)


@pytest.fixture(scope="module")
def original() -> dict[str, list[Problem]]:
    return stored("original", 22)


def entity_lists(comp: ComponentPanel) -> dict[str, list[int]]:
    return {a: [getattr(e, a) for e in comp.entities] for a in ("type", "size", "color", "angle")}


def differing_attributes(a: ComponentPanel, b: ComponentPanel) -> set[str]:
    """Which attribute groups differ between two versions of a component (entity order = identity)."""
    if len(a.slots) != len(b.slots):
        return {"Number"}
    diff = set()
    if set(a.slots) != set(b.slots):
        diff.add("Position")
    la, lb = entity_lists(a), entity_lists(b)
    diff |= {attr.capitalize() for attr in la if la[attr] != lb[attr]}
    return diff


def test_answer_index_is_uniform_and_balanced_case_mix() -> None:
    """Streams 2 x 7 x 2,000 problems: answer index uniform (chi-square); I-RAVEN case mix (docs/generator.md,
    "Balanced candidates (I-RAVEN)")."""
    case_mix = {c: Counter() for c in CONFIGURATIONS}
    for mode in ("balanced", "original"):
        targets = Counter()
        for configuration in CONFIGURATIONS:
            for p in generate_problems(configuration, PER_CONFIGURATION, seed=23, mode=mode):
                targets[p.target] += 1
                if mode == "balanced":
                    case_mix[configuration][len({pair for path in p.modified for pair in path})] += 1
        observed = [targets[k] for k in range(8)]
        assert chisquare(observed).pvalue > 1e-3, (mode, observed)
    for configuration, mix in case_mix.items():
        if configuration not in GRIDS:
            assert mix == Counter({3: PER_CONFIGURATION}), (configuration, mix)
        else:  # 2 (rarely 1) attributes only when a grid offers few modifiable attributes: ~6%
            assert 0.03 < (mix[2] + mix[1]) / PER_CONFIGURATION < 0.10, (configuration, mix)
    share_of_three = sum(m[3] for m in case_mix.values()) / (PER_CONFIGURATION * len(CONFIGURATIONS))
    assert 0.97 < share_of_three < 0.995  # docs/generator.md: about 98 %


def test_balanced_modified_lists_form_the_cube(balanced) -> None:
    for configuration, problems in balanced.items():
        for p in problems:
            assert len(p.candidates) == 8 and p.modified is not None and len(p.modified) == 8
            assert p.modified[p.target] == []
            assert all(p.modified[k] for k in range(8) if k != p.target)
            attributes = {pair for path in p.modified for pair in path}
            if len(attributes) == 3:
                # every subset of the 3 attributes, each exactly once; paths follow one attribute order
                subsets = Counter(frozenset(path) for path in p.modified)
                assert len(subsets) == 8 and set(subsets.values()) == {1}
                assert all(len(set(path)) == len(path) for path in p.modified)
                order = max(p.modified, key=len)
                assert all(path == [a for a in order if a in path] for path in p.modified)
                numbers = [a for a in order if a[1] == "Number"]
                assert not numbers or order[-1] == numbers[0]  # Number is applied last
            else:
                assert configuration in GRIDS


def test_balanced_cube_edges_change_exactly_one_attribute(balanced) -> None:
    """Candidates whose paths differ by one attribute differ in that attribute only (a cube edge)."""
    checked = 0
    for problems in balanced.values():
        for p in problems:
            paths = [frozenset(path) for path in p.modified]
            if len({a for path in paths for a in path}) != 3:
                continue
            for i, j in combinations(range(8), 2):
                delta = paths[i] ^ paths[j]
                if len(delta) != 1:
                    continue
                (c, attr), = delta
                for k, (a, b) in enumerate(zip(p.candidates[i].components, p.candidates[j].components)):
                    diff = differing_attributes(a, b)
                    if k != c:
                        assert diff == set()
                    elif attr == "Number":
                        assert diff == {"Number"}
                    else:
                        assert diff == {attr}, (attr, diff)
                checked += 1
    assert checked > 5_000


def test_balanced_two_attribute_cases_end_with_number(balanced) -> None:
    seen = 0
    for configuration in GRIDS:
        for p in balanced[configuration]:
            attributes = {a for path in p.modified for a in path}
            if len(attributes) == 2:
                seen += 1
                assert any(a[1] == "Number" for a in attributes)
                counts = Counter(len(comp.slots) for cand in p.candidates for comp in cand.components)
                assert len(counts) >= 3  # several alternative Number values, not one repeated
    assert seen > 0


def test_original_distractors_change_one_attribute(original) -> None:
    changed = Counter()
    odd_number_distractors = uniform_number_distractors = 0
    for problems in original.values():
        for p in problems:
            assert p.modified is None and len(p.candidates) == 8
            answer = p.answer
            for k, cand in enumerate(p.candidates):
                if k == p.target:
                    continue
                diffs = [(c, differing_attributes(a, b)) for c, (a, b) in
                         enumerate(zip(answer.components, cand.components))]
                diffs = [(c, d) for c, d in diffs if d]
                assert len(diffs) == 1, diffs
                c, d = diffs[0]
                if "Number" in d:
                    changed["Number"] += 1
                    comp = cand.components[c]
                    if answer.components[c].uniformity == 3 and len(comp.entities) > 1:
                        uniform_number_distractors += 1
                        odd_number_distractors += len({(e.type, e.size, e.color, e.angle) for e in comp.entities}) > 1
                else:
                    assert len(d) == 1, d
                    changed[d.pop()] += 1
    assert set(changed) == {"Number", "Position", "Type", "Size", "Color"}
    # RAVEN's Number distractors get fresh independent entities, even in uniform layouts
    assert uniform_number_distractors > 50 and odd_number_distractors / uniform_number_distractors > 0.9


def test_no_candidate_repeats_the_answer(balanced, original) -> None:
    for corpus in (balanced, original):
        for problems in corpus.values():
            for p in problems:
                keys = [
                    tuple(frozenset(zip(comp.slots, map(tuple, zip(*entity_lists(comp).values()))))
                          for comp in cand.components)
                    for cand in p.candidates
                ]
                assert len(set(keys)) == 8


def _answer(layout: str, slots: list[int], uniformity: int, entities: list[tuple[int, int, int, int]]) -> Panel:
    return Panel([ComponentPanel(layout, uniformity, slots, [Entity(*e) for e in entities])])


def test_modifiable_attributes_follow_visibility() -> None:
    constant = [Rule(0, "Constant", a) for a in ("Type", "Size", "Color")]
    entities = [(1, 2, 3, 0), (2, 3, 4, 1)]

    def names(np_rule: Rule, uniformity: int, entity_rules=constant) -> list[str]:
        rules = [np_rule] + list(entity_rules)
        answer = _answer("Distribute_Four", [0, 3], uniformity, entities)
        return [e.attr for e in modifiable_attributes(rules, [pruned_ranges("Distribute_Four", rules)], answer)]

    # entities resampled by a Number rule: Constant attributes are invisible, Position is not offered
    assert names(Rule(0, "Progression", "Number", 1), 0) == ["Number"]
    assert names(Rule(0, "Arithmetic", "Position", 1), 0) == ["Number", "Position"]
    # carried entities or a uniform layout make Constant attributes visible
    assert names(Rule(0, "Progression", "Position", 1), 0) == ["Number", "Position", "Type", "Size", "Color"]
    assert names(Rule(0, "Progression", "Number", 1), 3) == ["Number", "Type", "Size", "Color"]
    # a non-Constant rule is always modifiable, with one alternative level for all entities
    rules = [Rule(0, "Constant", "Type"), Rule(0, "Progression", "Size", 1), Rule(0, "Constant", "Color")]
    assert names(Rule(0, "Distribute_Three", "Number"), 0, rules) == ["Number", "Size"]
    single = [Rule(0, "Constant", "Number/Position")] + constant
    answer = _answer("Out_Center_Single", [0], 0, [(1, 3, 0, 0)])
    entries = modifiable_attributes(single, [pruned_ranges("Out_Center_Single", single)], answer)
    assert [(e.attr, e.times, e.uniform) for e in entries] == [("Type", 4, False), ("Size", 2, False)]


def test_original_candidates_use_all_alternatives_without_repeats() -> None:
    """Center with all-Constant rules: 7 distractors over Type (4 alternatives), Size (5), Color (9)."""
    from rpm_lib.generator.candidates import original_candidates
    from rpm_lib.generator.sampling import RandomStream

    rules = [Rule(0, "Constant", "Number/Position")] + [Rule(0, "Constant", a) for a in ("Type", "Size", "Color")]
    ranges = [pruned_ranges("Center_Single", rules)]
    answer = _answer("Center_Single", [0], 0, [(3, 2, 5, 4)])
    stream = RandomStream(np.random.default_rng(0))
    picks = Counter()
    for _ in range(3000):
        candidates, target = original_candidates(rules, ranges, answer, stream)
        assert candidates[target] is answer
        for k, cand in enumerate(candidates):
            if k != target:
                (d,) = differing_attributes(answer.components[0], cand.components[0])
                picks[d] += 1
    # attributes are drawn uniformly among the entries still available
    assert chisquare([picks["Type"], picks["Size"], picks["Color"]]).pvalue > 1e-3


def test_render_identical_sizes_table_matches_the_renderer() -> None:
    """The look-alike table lists exactly the size pairs the renderer draws identically."""
    from rpm_lib.generator.constants import CONFIG_SPECS, LAYOUTS, RENDER_IDENTICAL_SIZES

    found: dict[tuple[str, int], dict[int, int]] = {}
    for configuration, spec in CONFIG_SPECS.items():
        for c, (_, layout) in enumerate(spec.components):
            for type_level in range(1, 6):
                for angle in (3, 4):  # 0 and 45 degrees
                    images: dict[bytes, int] = {}
                    for size in range(LAYOUTS[layout].size[0], LAYOUTS[layout].size[1] + 1):
                        comps = [
                            ComponentPanel(other, 0, [0], [Entity(type_level, size, 5, angle)]) if k == c
                            else ComponentPanel(other, 0, [0], [Entity(1, LAYOUTS[other].size[0], 0, 3)])
                            for k, (_, other) in enumerate(spec.components)
                        ]
                        image = render.render_panel(configuration, Panel(comps)).tobytes()
                        if image in images:
                            found.setdefault((layout, type_level), {})[size] = images[image]
                        else:
                            images[image] = size
    assert found == RENDER_IDENTICAL_SIZES


def test_lookalike_candidates_are_detected_and_redrawn() -> None:
    from rpm_lib.generator.candidate_sets import make_candidates
    from rpm_lib.generator.lookalikes import has_lookalikes, rendered_key
    from rpm_lib.generator.sampling import RandomStream

    squares = _answer("In_Distribute_Four", [0, 1], 3, [(2, 3, 4, 1), (2, 3, 4, 1)])
    smaller = _answer("In_Distribute_Four", [0, 1], 3, [(2, 2, 4, 1), (2, 2, 4, 1)])
    triangles = _answer("In_Distribute_Four", [0, 1], 3, [(1, 2, 4, 1), (1, 2, 4, 1)])
    assert rendered_key(squares) == rendered_key(smaller) != rendered_key(triangles)
    assert has_lookalikes([squares, smaller]) and not has_lookalikes([squares, triangles])

    # uniform squares of size 3 under Constant Size: a size-2 alternative would look like the answer
    rules = [Rule(0, "Constant", "Number/Position"), Rule(0, "Constant", "Type"), Rule(0, "Constant", "Size"),
             Rule(0, "Constant", "Color")]
    ranges = [pruned_ranges("In_Distribute_Four", rules)]
    stream = RandomStream(np.random.default_rng(5))
    unguarded = sum(has_lookalikes(balanced_candidates(rules, ranges, squares, stream)[0]) for _ in range(200))
    assert unguarded > 20  # the reference algorithm alone does produce look-alikes here
    for mode in ("balanced", "original"):
        for _ in range(200):
            candidates, target, _ = make_candidates(mode, rules, ranges, squares, stream)
            assert candidates[target] is squares and not has_lookalikes(candidates)
