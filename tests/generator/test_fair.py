"""RAVEN-FAIR candidates (``mode="fair"``; docs/generator.md, "RAVEN-FAIR"): valid trees of one-attribute changes
with the blacklist, the reference solver's rejection rule, distinct images, seeds that reproduce, and the files."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from rpm_lib.generator import cli, fair_candidates, render, writer
from rpm_lib.generator.api import generate_problem, generate_problems, problem_rng
from rpm_lib.generator.candidate_sets import make_candidates
from rpm_lib.generator.candidates import check_mode, modifiable_attributes
from rpm_lib.generator.constants import LAYOUTS
from rpm_lib.generator.fair_candidates import FairTree, _changed, _Memory, _Node
from rpm_lib.generator.lookalikes import has_lookalikes, rendered_key
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel, Problem, Rule
from rpm_lib.generator.sampling import RandomStream, pruned_ranges
from rpm_lib.generator.validity import infer_rules, satisfying_candidates, solver_score
from rpm_lib.generator.xml_io import problem_xml, read_problem_xml
from rpm_lib.rules import CONFIGURATIONS

PER_CONFIGURATION = 80


@pytest.fixture(scope="module")
def problems() -> dict[str, list[Problem]]:
    return {c: list(generate_problems(c, PER_CONFIGURATION, seed=41, mode="fair")) for c in CONFIGURATIONS}


def changed_attributes(a: ComponentPanel, b: ComponentPanel) -> set[str]:
    """Attribute groups in which two versions of a component differ (entity order = identity)."""
    if len(a.slots) != len(b.slots):
        return {"Number"}
    diff = {"Position"} if set(a.slots) != set(b.slots) else set()
    for attr in ("type", "size", "color", "angle"):
        if [getattr(e, attr) for e in a.entities] != [getattr(e, attr) for e in b.entities]:
            diff.add(attr.capitalize())
    return diff


def test_the_answer_alone_satisfies_every_rule_and_all_images_differ(problems) -> None:
    for configuration, batch in problems.items():
        for p in batch:
            assert p.mode == "fair" and p.modified is None and len(p.candidates) == 8
            assert satisfying_candidates(p) == [p.target], (configuration, p.extra["index"])
            assert not has_lookalikes(p.candidates)
        for p in batch[:8]:  # pixels too, on a few per configuration
            image = render.render_problem(p)
            assert len({image[8 + k].tobytes() for k in range(8)}) == 8, (configuration, p.extra["index"])


def test_each_distractor_changes_one_attribute_of_its_parent_and_never_an_attribute_twice(problems) -> None:
    depths, changes = Counter(), Counter()
    for batch in problems.values():
        for p in batch:
            tree: FairTree = p.extra["fair_tree"]
            assert tree.parents[p.target] == -1 and tree.modified[p.target] == []
            assert sorted(tree.parents).count(-1) == 1
            for k, cand in enumerate(p.candidates):
                if k == p.target:
                    continue
                parent = tree.parents[k]
                assert 0 <= parent < 8 and parent != k
                path = tree.modified[k]
                assert path[:-1] == tree.modified[parent]  # one step below its parent
                names = [attr for _, attr in path]
                assert len(set(names)) == len(names), path  # the blacklist: each attribute name once on a path
                c, attr = path[-1]
                diffs = {i: changed_attributes(a, b) for i, (a, b) in
                         enumerate(zip(p.candidates[parent].components, cand.components))}
                assert {i for i, d in diffs.items() if d} == {c}, (path, diffs)
                assert diffs[c] == {attr}, (path, diffs)
                depths[len(path)] += 1
                changes[attr] += 1
            assert tree.depths[p.target] == 0 and max(tree.depths) <= 5
    # a tree, not RAVEN's star: distractors two and three changes away from the answer are common
    assert depths[1] and depths[2] > 0.2 * sum(depths.values()) and depths[3] > 0
    assert set(changes) == {"Number", "Position", "Type", "Size", "Color"}


def test_the_answer_has_the_full_solver_score_and_no_distractor_reaches_it(problems) -> None:
    for batch in problems.values():
        for p in batch:
            inferred = infer_rules(p)
            scores = [solver_score(inferred, p.context[6], p.context[7], cand) for cand in p.candidates]
            assert scores[p.target] == len(p.rules)
            assert max(s for k, s in enumerate(scores) if k != p.target) < len(p.rules)


def _reference_solver(problem: Problem, candidate: Panel) -> int:
    """solver.py of the reference generators, line by line: rule values from ``Rule.value``, Distribute_Three triples
    from row 3 (P31, P32 and the answer), entities compared by index under a Constant rule."""
    p31, p32, answer = problem.context[6], problem.context[7], problem.answer
    score = 0
    for c in range(len(problem.rules) // 4):
        np_rule, *entity_rules = problem.rules[4 * c: 4 * c + 4]
        a, b, x, t = p31.components[c], p32.components[c], candidate.components[c], answer.components[c]
        n = len(LAYOUTS[x.layout].slots)
        sets = [frozenset(p.slots) for p in (a, b, x)]
        counts = [len(p.slots) for p in (a, b, x)]
        if np_rule.name == "Constant":
            score += sets[2] == sets[0] and sets[2] == sets[1]
        elif np_rule.name == "Progression" and np_rule.attr == "Number":
            score += 2 * counts[1] == counts[0] + counts[2]
        elif np_rule.name == "Progression":
            d = np_rule.value
            score += (frozenset((s + d) % n for s in a.slots) == sets[1]
                      and frozenset((s + d) % n for s in b.slots) == sets[2])
        elif np_rule.name == "Arithmetic" and np_rule.attr == "Number":
            score += counts[2] == (counts[0] + counts[1] if np_rule.value > 0 else counts[0] - counts[1])
        elif np_rule.name == "Arithmetic":
            score += sets[2] == (sets[0] | sets[1] if np_rule.value > 0 else sets[0] - sets[1])
        else:
            key = len if np_rule.attr == "Number" else frozenset
            triple = [key(p.slots) for p in (a, b, t)]
            score += [key(p.slots) for p in (a, b, x)] == triple
        regenerate = np_rule.attr == "Number" or np_rule.name == "Arithmetic"
        for rule in entity_rules:
            attr = rule.attr.lower()
            levels = [[getattr(e, attr) for e in p.entities] for p in (a, b, x, t)]
            consistent = len(set(levels[2])) == 1
            if rule.name == "Constant":
                if x.uniformity == 3:
                    score += consistent and levels[2][0] == levels[1][0]
                elif counts[0] == counts[1] == counts[2]:
                    score += regenerate or all(levels[2][i] == levels[1][i] for i in range(len(levels[2])))
                else:
                    score += 1
            elif not consistent:
                continue
            elif rule.name == "Progression":
                score += 2 * levels[1][0] == levels[0][0] + levels[2][0]
            elif rule.name == "Arithmetic":
                offset = 0 if attr == "color" else 1
                sign = 1 if rule.value > 0 else -1
                score += levels[2][0] == levels[0][0] + sign * (levels[1][0] + offset)
            else:  # the rule's triple for row 3 is (P31, P32, answer)
                score += (levels[0][0], levels[1][0], levels[2][0]) == (levels[0][0], levels[1][0], levels[3][0])
    return int(score)


def _perturbed(panel: Panel, rng: np.random.Generator) -> Panel:
    """A copy with a few random edits: a level of one or all entities, the entity order, the slots, the count."""
    new = panel.copy()
    for _ in range(int(rng.integers(1, 4))):
        comp = new.components[int(rng.integers(len(new.components)))]
        kind = int(rng.integers(5))
        attr = ("type", "size", "color")[int(rng.integers(3))]
        if kind == 0:
            e = comp.entities[int(rng.integers(len(comp.entities)))]
            setattr(e, attr, max(0, getattr(e, attr) + int(rng.choice([-1, 1]))))
        elif kind == 1:
            shift = int(rng.choice([-1, 1]))
            for e in comp.entities:
                setattr(e, attr, max(0, getattr(e, attr) + shift))
        elif kind == 2 and len(comp.slots) > 1:  # the same occupied slots, the entities in another order
            order = list(rng.permutation(len(comp.slots)))
            comp.entities = [comp.entities[i] for i in order]
        elif kind == 3:
            n = len(LAYOUTS[comp.layout].slots)
            comp.slots = [int(s) for s in rng.choice(n, len(comp.slots), replace=False)]
        elif len(comp.slots) > 1:
            comp.slots, comp.entities = comp.slots[:-1], comp.entities[:-1]
    return new


@pytest.mark.parametrize("mode", ["fair", "original", "balanced"])
def test_solver_score_equals_the_reference_solver_on_any_panel(mode: str) -> None:
    """The rejection rule is the reference solver's count, checked against a port of solver.py on the candidates of
    every mode and on randomly edited copies of them (edits that keep or break rules, entity orders included)."""
    rng = np.random.default_rng(5)
    compared = Counter()
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 25, seed=42, mode=mode):
            inferred = infer_rules(p)
            panels = list(p.candidates) + [_perturbed(p.candidates[int(rng.integers(8))], rng) for _ in range(6)]
            for panel in panels:
                ours = solver_score(inferred, p.context[6], p.context[7], panel)
                assert ours == _reference_solver(p, panel), (configuration, p.extra["index"], p.rules)
                compared[ours == len(p.rules)] += 1
    assert compared[True] >= 7 * 25 and compared[False] > 5 * 7 * 25


def test_same_seed_same_problems_and_files(tmp_path) -> None:
    def made(seed: int) -> list[tuple]:
        out = []
        for configuration in ("distribute_four", "in_distribute_four_out_center_single"):
            for k in range(6):
                p = generate_problem(configuration, problem_rng(seed, configuration, k), "fair")
                out.append((problem_xml(p), p.target, p.extra["fair_tree"]))
        return out

    assert made(3) == made(3)
    assert [x for x, _, _ in made(3)] != [x for x, _, _ in made(4)]
    for name in ("a", "b"):
        writer.write_dataset(tmp_path / name, ["Center", "O-IG"], count=3, seed=9, mode="fair", progress=False)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("RAVEN_*"))
    assert len(files) == 12
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)


def test_fair_files_read_back_like_raven_files(tmp_path) -> None:
    writer.write_dataset(tmp_path, ["2x2Grid"], count=2, seed=2, mode="fair", progress=False)
    assert json.loads((tmp_path / "generator.json").read_text())["mode"] == "fair"
    for k, stem in enumerate(sorted((tmp_path / "distribute_four").glob("*.xml"))):
        problem = generate_problem("distribute_four", problem_rng(2, "distribute_four", k), "fair")
        assert b"Modified_attributes" not in stem.read_bytes()
        loaded = read_problem_xml(stem)  # the target from the .npz, as for RAVEN's files
        assert loaded.mode == "original" and loaded.target == problem.target
        assert loaded.candidates == problem.candidates and satisfying_candidates(loaded) == [loaded.target]
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as data:
            assert sorted(data.files) == sorted(["image", "target", "predict", "meta_matrix", "meta_target",
                                                 "structure", "meta_structure"])
            assert int(data["predict"]) == int(data["target"]) == problem.target
    with pytest.raises(Exception, match="mode 'fair' there, 'original' asked"):
        writer.write_dataset(tmp_path, ["2x2Grid"], count=2, seed=2, mode="original", progress=False)


@pytest.mark.parametrize("argv", [["--mesh", "--mode", "fair"], ["--regime", "I-RAVEN-Mesh", "--mode", "fair"]])
def test_fair_mode_with_the_mesh_is_refused_in_one_line(argv, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--out", "x", "--num-per-config", "1", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fair (RAVEN-FAIR) candidates are not defined for a Mesh problem" in err[0], err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="not defined for a Mesh problem"):
        check_mode("fair", mesh=True)
    with pytest.raises(ValueError, match="not defined for a Mesh problem"):
        generate_problem("center_single", problem_rng(0, "center_single", 0), "fair", regime="I-RAVEN-Mesh")


# -------------------------------------------------------------------------------------------------
# The procedure on hand-made problems
# -------------------------------------------------------------------------------------------------

CONSTANT = [Rule(0, "Constant", "Number/Position"), Rule(0, "Constant", "Type"), Rule(0, "Constant", "Size"),
            Rule(0, "Constant", "Color")]


def _constant_problem(layouts_entities: list[tuple[str, list[int], int, list[tuple]]]):
    """All-Constant rules, a context of 8 copies of the answer (which follows every Constant rule)."""
    rules, ranges, components = [], [], []
    for c, (layout, slots, uniformity, entities) in enumerate(layouts_entities):
        group = [Rule(c, r.name, r.attr) for r in CONSTANT]
        rules += group
        ranges.append(pruned_ranges(layout, group))
        components.append(ComponentPanel(layout, uniformity, slots, [Entity(*e) for e in entities]))
    answer = Panel(components)
    return rules, ranges, answer, [answer.copy() for _ in range(8)]


def test_look_alike_draws_are_rejected_one_by_one() -> None:
    """Uniform squares of Size 0.7 in In_Distribute_Four: a Size 0.6 distractor would look like the answer, and the
    reference throws such a draw away (its images are equal); the tree then grows on."""
    rules, ranges, answer, context = _constant_problem([
        ("Out_Center_Single", [0], 0, [(5, 4, 0, 3)]),
        ("In_Distribute_Four", [0, 1], 3, [(2, 3, 4, 1), (2, 3, 4, 1)]),
    ])
    stream = RandomStream(np.random.default_rng(7))
    rejected = Counter()
    for _ in range(300):
        candidates, target, tree = fair_candidates.fair_candidates(rules, ranges, answer, context, stream)
        assert candidates[target] is answer and not has_lookalikes(candidates)
        rejected.update(tree.rejected)
    assert rejected["duplicate"] > 5 and rejected["rules"] == 0


def test_a_draw_the_solver_scores_like_the_answer_is_rejected(monkeypatch) -> None:
    rules, ranges, answer, context = _constant_problem([("Center_Single", [0], 0, [(3, 2, 5, 4)])])
    real = fair_candidates.solver_score
    calls = Counter()

    def every_third_draw_looks_right(inferred, p31, p32, x):
        calls["n"] += 1
        if calls["n"] > 1 and calls["n"] % 3 == 0:  # call 1 is the answer's
            return real(inferred, p31, p32, answer)
        return real(inferred, p31, p32, x)

    monkeypatch.setattr(fair_candidates, "solver_score", every_third_draw_looks_right)
    candidates, target, tree = fair_candidates.fair_candidates(rules, ranges, answer, context,
                                                               RandomStream(np.random.default_rng(1)))
    assert tree.rejected["rules"] == calls["n"] // 3 >= 2
    assert len({rendered_key(c) for c in candidates}) == 8


def test_the_changes_of_one_parent_in_one_attribute_get_distinct_levels() -> None:
    """Center, all Constant: RAVEN's memory gives the changes of one parent in one attribute distinct levels."""
    rules, ranges, answer, context = _constant_problem([("Center_Single", [0], 0, [(3, 2, 5, 4)])])
    stream = RandomStream(np.random.default_rng(3))
    groups = 0
    for _ in range(300):
        candidates, _, tree = fair_candidates.fair_candidates(rules, ranges, answer, context, stream)
        children: dict[tuple[int, str], list[int]] = {}
        for k, path in enumerate(tree.modified):
            if path:
                attr = path[-1][1]
                children.setdefault((tree.parents[k], attr), []).append(
                    getattr(candidates[k].components[0].entities[0], attr.lower()))
        for levels in children.values():
            assert len(set(levels)) == len(levels), levels
            groups += len(levels) > 1
    assert groups > 100


def test_a_draw_with_no_value_left_fails_and_keeps_what_the_reference_keeps() -> None:
    rules, ranges, answer, context = _constant_problem([("Distribute_Four", [0, 1, 2], 0,
                                                         [(1, 2, 3, 0), (2, 3, 4, 1), (3, 4, 5, 2)])])
    entries = modifiable_attributes(rules, ranges, answer)
    position = next(e for e in entries if e.attr == "Position")
    memory = _Memory.fresh(ranges, answer)
    memory.positions[0] = [frozenset(s) for s in ([0, 1, 3], [0, 2, 3], [1, 2, 3])]  # with the answer's: all 4
    node = _Node(answer, entries, frozenset(), [], -1, memory)
    stream = RandomStream(np.random.default_rng(0))
    assert _changed(node, memory.copy(), position, ranges, stream) is None
    assert len(memory.positions[0]) == 3  # nothing recorded

    size = next(e for e in entries if e.attr == "Size")  # levels 0..5; entity 1 (size 3) has seen all others
    memory = _Memory.fresh(ranges, answer)
    memory.levels[0][1]["size"] = [0, 1, 2, 4, 5]
    node = _Node(answer, entries, frozenset(), [], -1, memory)
    assert _changed(node, memory.copy(), size, ranges, stream) is None
    assert len(memory.levels[0][0]["size"]) == 1  # entity 0 drew before entity 1 failed (the reference keeps it)


def test_make_candidates_needs_the_context_in_fair_mode() -> None:
    rules, ranges, answer, context = _constant_problem([("Center_Single", [0], 0, [(3, 2, 5, 4)])])
    stream = RandomStream(np.random.default_rng(0))
    with pytest.raises(ValueError, match="need the 8 context panels"):
        make_candidates("fair", rules, ranges, answer, stream)
    candidates, target, tree = make_candidates("fair", rules, ranges, answer, stream, context=context)
    assert candidates[target] is answer and isinstance(tree, FairTree)


def test_the_context_blind_probe_finds_the_answer_more_often_than_chance_but_far_less_than_in_raven(problems) -> None:
    """The answer is the root of the tree and keeps the most common value of most attributes: the majority probe
    scores about 23 % on RAVEN-FAIR (ours and the reference's alike; docs/generator.md "RAVEN-FAIR"), 98 % on RAVEN."""
    from rpm_lib.generator.bias import chance_interval, context_blind_choice

    ties = np.random.default_rng(0)
    batch = [p for ps in problems.values() for p in ps]
    accuracy = np.mean([context_blind_choice(p.candidates, ties) == p.target for p in batch])
    _, high = chance_interval(len(batch))
    assert high < accuracy < 0.32, accuracy
