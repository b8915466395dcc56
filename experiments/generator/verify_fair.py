"""Verify RAVEN-FAIR candidates (``mode="fair"``; docs/generator.md, "RAVEN-FAIR") at scale, and compare them with
files written by the reference generator (yanivbenny/RAVEN_FAIR).

    .venv/bin/python experiments/generator/verify_fair.py [--per-config 300] [--image-per-config 300] [--seed 2024]
        [--configurations all] [--reference-run DIR [--reference-log FILE]]

Part 1, per configuration, ``--per-config`` fair problems (``generate_problems(..., mode="fair")``): exactly one
candidate satisfies every rule (``validity.satisfying_candidates``); every distractor differs from its parent in
exactly the one attribute its tree records and no attribute name twice on a path (``problem.extra["fair_tree"]``);
the 8 rendered candidate images differ (first ``--image-per-config`` problems); the context-blind probe
(``bias.context_blind_choice``) with the 99 % interval of chance; how many drawn candidates were thrown away, and
why.

Part 2, what the files show, for our fair problems, our RAVEN problems (``mode="original"``, the same count: a
contrast that shows what the tests can tell apart) and, with ``--reference-run``, the reference's RAVEN-FAIR files
(a folder of ``<configuration>/RAVEN_<k>_<split>.xml`` + ``.npz``, e.g. ``python main.py --fair 1 --save-dir D
--num-samples 300`` run from the reference's ``src``; its answer is the ``.npz`` target). Per problem:

* the *distance* of a distractor from the answer: over the components, 1 where the count differs, else the number
  of attribute groups (Position as a set, Type, Size, Color entity by entity) that differ;
* the tree as far as the files show it: the graph whose edges join candidates at distance 1 (every parent and
  child are), the answer's degree in it and the largest graph distance from the answer;
* which attribute groups differ from the answer;
* the context-blind probe, and per attribute whether the answer holds the most common value among the candidates.

Each test takes one value per problem (the distractor that comes first in the file's shuffled order stands for a
random distractor), so problems are independent units: chi-square tests of homogeneity, ours vs the reference.
Per configuration, the number of distractors per problem that differ from the answer in each attribute is
compared too (Welch t-tests). ``--reference-log`` is the reference's printed output: its warnings count the draws
it threw away. ``--configurations`` restricts both sides to some configurations (e.g. a reference run stopped
early).

Prints Markdown tables and the command line; exits 1 when a validity check of part 1 fails.
"""
from __future__ import annotations

import argparse
import platform
import sys
from collections import Counter, deque
from pathlib import Path

import numpy as np
from scipy.stats import chi2_contingency, ttest_ind

from rpm_lib.generator.api import generate_problems
from rpm_lib.generator.bias import candidate_features, chance_interval, context_blind_choice
from rpm_lib.generator.fair_candidates import REJECTIONS
from rpm_lib.generator.problem import ComponentPanel, Panel, Problem
from rpm_lib.generator.render import render_problem
from rpm_lib.generator.validity import satisfying_candidates
from rpm_lib.rules import SHORT_NAMES, resolve_configurations

ATTRIBUTES = ("Number", "Position", "Type", "Size", "Color")
#: The reference's printed warnings, by the reason our tree records (``fair_candidates.REJECTIONS``).
REFERENCE_WARNINGS = {"rules": "Accidentally generated good answer", "duplicate": "New answer equals existing image",
                      "exhausted": "Attempt to sample failed"}
DISTANCE_BINS = ("1", "2", "3", ">=4")
DEGREE_BINS = ("1", "2", "3", "4", "5", ">=6")
DEPTH_BINS = ("1", "2", "3", ">=4")


def component_changes(a: ComponentPanel, b: ComponentPanel) -> set[str]:
    """Attribute groups in which two versions of a component differ; a count change hides the rest."""
    if len(a.slots) != len(b.slots):
        return {"Number"}
    changes = {"Position"} if set(a.slots) != set(b.slots) else set()
    for attr in ("Type", "Size", "Color"):
        if [getattr(e, attr.lower()) for e in a.entities] != [getattr(e, attr.lower()) for e in b.entities]:
            changes.add(attr)
    return changes


def changes(a: Panel, b: Panel) -> list[str]:
    """The attribute groups that differ, one entry per (component, group)."""
    return [name for x, y in zip(a.components, b.components) for name in sorted(component_changes(x, y))]


def _binned(value: int, bins: tuple[str, ...]) -> str:
    top = int(bins[-1][2:])
    return bins[-1] if value >= top else str(value)


class Visible:
    """Per-problem statistics of what the files show (module doc, part 2), for one source."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problems = 0
        self.distance = Counter()           # one random distractor per problem
        self.all_distances = Counter()      # every distractor
        self.degree = Counter()
        self.depth = Counter()
        self.connected = 0
        self.first_differs = {attr: 0 for attr in ATTRIBUTES}   # the random distractor differs in it
        self.all_differs = Counter()
        self.probe = 0
        self.majority = {attr: Counter() for attr in ATTRIBUTES}  # "unique", "tied", "not" (features that vary)
        self.per_configuration: dict[str, list[int]] = {}  # problems, probe hits, distance sum of random distractors
        self.changes_per_problem: dict[str, list[list[int]]] = {}  # per problem: distractors differing per attribute
        self._ties = np.random.default_rng(0xFA12)

    def add(self, problem: Problem) -> None:
        cands, target = problem.candidates, problem.target
        answer = cands[target]
        distances = [len(changes(answer, c)) for c in cands]
        first = next(k for k in range(8) if k != target)
        self.problems += 1
        self.distance[_binned(distances[first], DISTANCE_BINS)] += 1
        self.all_distances.update(_binned(d, DISTANCE_BINS) for k, d in enumerate(distances) if k != target)
        for name in set(changes(answer, cands[first])):
            self.first_differs[name] += 1
        for k in range(8):
            if k != target:
                self.all_differs.update(changes(answer, cands[k]))
        near = [[j for j in range(8) if j != i and len(changes(cands[i], cands[j])) == 1] for i in range(8)]
        self.degree[_binned(len(near[target]), DEGREE_BINS)] += 1
        hops = {target: 0}
        queue = deque([target])
        while queue:
            i = queue.popleft()
            for j in near[i]:
                if j not in hops:
                    hops[j] = hops[i] + 1
                    queue.append(j)
        self.connected += len(hops) == 8
        self.depth[_binned(max(hops.values()), DEPTH_BINS)] += 1
        hit = int(context_blind_choice(cands, self._ties) == target)
        self.probe += hit
        features = [candidate_features(c) for c in cands]
        for f in range(len(features[0])):
            values = Counter(feats[f] for feats in features)
            if len(values) == 1:
                continue
            mine, top = values[features[target][f]], max(values.values())
            verdict = "not" if mine < top else ("unique" if list(values.values()).count(top) == 1 else "tied")
            self.majority[features[target][f][1]][verdict] += 1
        self.changes_per_problem.setdefault(problem.configuration, []).append(
            [sum(a in changes(answer, c) for k, c in enumerate(cands) if k != target) for a in ATTRIBUTES])
        row = self.per_configuration.setdefault(problem.configuration, [0, 0, 0])
        row[0] += 1
        row[1] += hit
        row[2] += distances[first]


def _p(a: Counter | dict, b: Counter | dict, keys) -> float:
    """Chi-square test of homogeneity of two count tables over ``keys`` (empty columns dropped)."""
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return float("nan")
    return float(chi2_contingency(table)[1])


def _p_share(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    return _p({"y": hits_a, "n": n_a - hits_a}, {"y": hits_b, "n": n_b - hits_b}, ("y", "n"))


def check_ours(configurations: list[str], per_config: int, image_per_config: int,
               seed: int) -> tuple[dict, Visible, Visible]:
    """Part 1 on our fair problems; part 2's statistics for them and for our RAVEN problems."""
    found = Counter()
    fair, raven = Visible("ours, fair"), Visible("ours, original (RAVEN)")
    for configuration in configurations:
        for k, p in enumerate(generate_problems(configuration, per_config, seed=seed, mode="fair")):
            found["problems"] += 1
            found["unique"] += satisfying_candidates(p) == [p.target]
            tree = p.extra["fair_tree"]
            found.update({f"rejected_{why}": n for why, n in tree.rejected.items()})
            found["true_depth_" + _binned(max(tree.depths), DEPTH_BINS)] += 1
            found["children_" + _binned(tree.parents.count(p.target), DEGREE_BINS)] += 1
            for j, cand in enumerate(p.candidates):
                if j == p.target:
                    continue
                path, parent = tree.modified[j], tree.parents[j]
                one_change = changes(p.candidates[parent], cand) == [path[-1][1]]
                names = [attr for _, attr in path]
                found["bad_edges"] += not one_change or path[:-1] != tree.modified[parent]
                found["blacklist_broken"] += len(set(names)) != len(names)
            if k < image_per_config:
                image = render_problem(p)
                found["rendered"] += 1
                found["equal_images"] += len({image[8 + j].tobytes() for j in range(8)}) < 8
            fair.add(p)
        for p in generate_problems(configuration, per_config, seed=seed, mode="original"):
            raven.add(p)
    return dict(found), fair, raven


def read_reference(folder: Path, log: Path | None, configurations: list[str]) -> tuple[dict, Visible]:
    """The reference's files read back: validity, equal candidate images, part 2's statistics, its warnings."""
    from rpm_lib.generator.xml_io import read_problem_xml

    paths = sorted((p for c in configurations for p in (folder / c).glob("RAVEN_*.xml")),
                   key=lambda p: (p.parent.name, int(p.stem.split("_")[1])))
    if not paths:
        raise SystemExit(f"--reference-run: no <configuration>/RAVEN_*.xml of {', '.join(configurations)} under "
                         f"{folder}")
    found = Counter()
    visible = Visible("reference RAVEN-FAIR")
    for path in paths:
        problem = read_problem_xml(path)
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as data:
            image = data["image"]
        found["problems"] += 1
        found["unique"] += satisfying_candidates(problem) == [problem.target]
        found["equal_images"] += len({image[8 + j].tobytes() for j in range(8)}) < 8
        visible.add(problem)
    if log is not None:
        text = log.read_text(errors="replace")
        for why, warning in REFERENCE_WARNINGS.items():
            found[f"rejected_{why}"] = text.count(warning)
    return dict(found), visible


def _table(sources: list[Visible], title: str, bins, get) -> list[str]:
    lines = [f"| {title} | " + " | ".join(bins) + " |", "|---|" + "---:|" * len(bins)]
    for s in sources:
        counts = get(s)
        total = sum(counts.get(b, 0) for b in bins)
        lines.append(f"| {s.name} | " + " | ".join(f"{100 * counts.get(b, 0) / total:.1f} %" for b in bins) + " |")
    return lines


def report(ours: dict, fair: Visible, raven: Visible, reference: dict | None, ref: Visible | None, args) -> int:
    n = ours["problems"]
    low, high = chance_interval(n)
    failures = (n - ours["unique"]) + ours["bad_edges"] + ours["blacklist_broken"] + ours.get("equal_images", 0)
    print(f"command: `python experiments/generator/verify_fair.py {' '.join(sys.argv[1:])}`  ")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}\n")
    print(f"## Part 1: our fair problems ({args.per_config} per configuration, seed {args.seed})\n")
    print("| check | result |\n|---|---:|")
    print(f"| exactly one candidate satisfies every rule | {ours['unique']} / {n} |")
    print(f"| distractors not one change below their parent | {ours['bad_edges']} |")
    print(f"| paths with an attribute name twice | {ours['blacklist_broken']} |")
    print(f"| problems with two equal candidate images | {ours.get('equal_images', 0)} / {ours.get('rendered', 0)} |")
    print(f"| context-blind probe | {100 * fair.probe / n:.2f} % (99 % interval of chance "
          f"{100 * low:.2f}-{100 * high:.2f} %) |")
    for why in REJECTIONS:
        print(f"| drawn candidates thrown away: {why}, per problem | {ours.get(f'rejected_{why}', 0) / n:.4f} |")
    depth = Counter({b: ours.get(f"true_depth_{b}", 0) for b in DEPTH_BINS})
    children = Counter({b: ours.get(f"children_{b}", 0) for b in DEGREE_BINS})
    print("\nThe recorded trees beside what the files show of them (ours):\n")
    print("| depth of the tree | " + " | ".join(DEPTH_BINS) + " |\n|---|" + "---:|" * len(DEPTH_BINS))
    print("| recorded (FairTree) | " + " | ".join(f"{100 * depth[b] / n:.1f} %" for b in DEPTH_BINS) + " |")
    print("| largest graph distance | " + " | ".join(f"{100 * fair.depth[b] / n:.1f} %" for b in DEPTH_BINS) + " |")
    print("\n| answer's children | " + " | ".join(DEGREE_BINS) + " |\n|---|" + "---:|" * len(DEGREE_BINS))
    print("| recorded (FairTree) | " + " | ".join(f"{100 * children[b] / n:.1f} %" for b in DEGREE_BINS) + " |")
    print("| answer's degree in the graph | " + " | ".join(f"{100 * fair.degree[b] / n:.1f} %"
                                                         for b in DEGREE_BINS) + " |")

    sources = [fair, raven] + ([ref] if ref is not None else [])
    print("\n## Part 2: what the files show\n")
    print("| source | problems | connected graph | probe | mean distance (random distractor) |")
    print("|---|---:|---:|---:|---:|")
    for s in sources:
        mean = sum(r[2] for r in s.per_configuration.values()) / s.problems
        print(f"| {s.name} | {s.problems} | {100 * s.connected / s.problems:.1f} % | "
              f"{100 * s.probe / s.problems:.2f} % | {mean:.3f} |")
    print()
    print("\n".join(_table(sources, "distance of a random distractor", DISTANCE_BINS, lambda s: s.distance)))
    print()
    print("\n".join(_table(sources, "distance, every distractor", DISTANCE_BINS, lambda s: s.all_distances)))
    print()
    print("\n".join(_table(sources, "answer's degree", DEGREE_BINS, lambda s: s.degree)))
    print()
    print("\n".join(_table(sources, "largest distance from the answer in the graph", DEPTH_BINS, lambda s: s.depth)))
    print("\n| a random distractor differs from the answer in | " + " | ".join(ATTRIBUTES) + " |")
    print("|---|" + "---:|" * len(ATTRIBUTES))
    for s in sources:
        print(f"| {s.name} | " + " | ".join(f"{100 * s.first_differs[a] / s.problems:.1f} %" for a in ATTRIBUTES)
              + " |")
    print("\n| the answer holds the most common value (alone / tied / not), features that vary | "
          + " | ".join(ATTRIBUTES) + " |")
    print("|---|" + "---|" * len(ATTRIBUTES))
    for s in sources:
        cells = []
        for a in ATTRIBUTES:
            m = s.majority[a]
            total = sum(m.values()) or 1
            cells.append(" / ".join(f"{100 * m[v] / total:.0f}" for v in ("unique", "tied", "not")) + " %")
        print(f"| {s.name} | " + " | ".join(cells) + " |")
    print("\n| configuration | " + " | ".join(f"{s.name}: probe / mean distance" for s in sources) + " |")
    print("|---|" + "---:|" * len(sources))
    for c in args.configurations:
        cells = []
        for s in sources:
            count, hits, total = s.per_configuration.get(c, [0, 0, 0])
            cells.append(f"{100 * hits / count:.1f} % / {total / count:.2f}" if count else "-")
        print(f"| {SHORT_NAMES[c]} | " + " | ".join(cells) + " |")

    if ref is not None:
        r_n = reference["problems"]
        print(f"\n## Part 3: against the reference ({r_n} problems in {args.reference_run})\n")
        print(f"Reference files read back: exactly one valid candidate in {reference['unique']} / {r_n}; problems with "
              f"two equal candidate images: {reference['equal_images']}.")
        if args.reference_log is not None:
            print("Drawn candidates it threw away, per problem: " + ", ".join(
                f"{why} {reference.get(f'rejected_{why}', 0) / r_n:.4f}" for why in REJECTIONS)
                + " (ours: " + ", ".join(f"{why} {ours.get(f'rejected_{why}', 0) / n:.4f}" for why in REJECTIONS)
                + ").")
        print("\nChi-square tests of homogeneity, one value per problem (p-values):\n")
        print("| statistic | ours fair vs reference | ours RAVEN vs reference |\n|---|---:|---:|")
        tests = [
            ("distance of a random distractor", lambda s: s.distance, DISTANCE_BINS),
            ("answer's degree in the graph", lambda s: s.degree, DEGREE_BINS),
            ("largest graph distance from the answer", lambda s: s.depth, DEPTH_BINS),
        ]
        for title, get, bins in tests:
            print(f"| {title} | {_p(get(fair), get(ref), bins):.3g} | {_p(get(raven), get(ref), bins):.3g} |")
        for a in ATTRIBUTES:
            print(f"| a random distractor differs in {a} | "
                  f"{_p_share(fair.first_differs[a], fair.problems, ref.first_differs[a], ref.problems):.3g} | "
                  f"{_p_share(raven.first_differs[a], raven.problems, ref.first_differs[a], ref.problems):.3g} |")
        print(f"| context-blind probe hits | {_p_share(fair.probe, fair.problems, ref.probe, ref.problems):.3g} | "
              f"{_p_share(raven.probe, raven.problems, ref.probe, ref.problems):.3g} |")
        for a in ATTRIBUTES:
            keys = ("unique", "tied", "not")
            print(f"| answer holds the most common {a} (features) | "
                  f"{_p(fair.majority[a], ref.majority[a], keys):.3g} | {_p(raven.majority[a], ref.majority[a], keys):.3g} |")
        print("\nDistractors per problem that differ from the answer in each attribute, ours fair / reference (Welch "
              "t-test p), per configuration:\n")
        print("| configuration | problems (ours / reference) | " + " | ".join(ATTRIBUTES) + " |")
        print("|---|---:|" + "---:|" * len(ATTRIBUTES))
        for c in args.configurations:
            mine, theirs = (np.array(s.changes_per_problem.get(c, [])) for s in (fair, ref))
            if not len(mine) or not len(theirs):
                continue
            cells = []
            for i in range(len(ATTRIBUTES)):
                same = mine[:, i].var() == 0 and theirs[:, i].var() == 0
                p_value = float("nan") if same else ttest_ind(mine[:, i], theirs[:, i], equal_var=False).pvalue
                cells.append(f"{mine[:, i].mean():.3f} / {theirs[:, i].mean():.3f} ({p_value:.2g})")
            print(f"| {SHORT_NAMES[c]} | {len(mine)} / {len(theirs)} | " + " | ".join(cells) + " |")
        failures += r_n - reference["unique"]
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-config", type=int, default=300, help="problems per configuration and mode (default 300)")
    parser.add_argument("--image-per-config", type=int, default=300,
                        help="of which rendered to compare the candidate images (default 300)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--configurations", default="all",
                        help="'all' (default) or a comma-separated list of configuration folder or short names")
    parser.add_argument("--reference-run", type=Path, default=None, metavar="DIR",
                        help="a folder of RAVEN-FAIR files written by the reference generator")
    parser.add_argument("--reference-log", type=Path, default=None, metavar="FILE",
                        help="the reference generator's printed output (its warnings)")
    args = parser.parse_args(argv)
    if args.per_config < 1 or args.image_per_config < 0 or args.seed < 0:
        parser.error("--per-config must be >= 1, --image-per-config and --seed >= 0")
    if args.reference_run is not None and not args.reference_run.is_dir():
        parser.error(f"--reference-run: {args.reference_run} is not a folder")
    if args.reference_log is not None and not args.reference_log.is_file():
        parser.error(f"--reference-log: {args.reference_log} is not a file")
    try:
        args.configurations = resolve_configurations(args.configurations)
    except ValueError as error:
        parser.error(f"--configurations: {error}")
    ours, fair, raven = check_ours(args.configurations, args.per_config, args.image_per_config, args.seed)
    reference, ref = (read_reference(args.reference_run, args.reference_log, args.configurations)
                      if args.reference_run else (None, None))
    return report(ours, fair, raven, reference, ref, args)


if __name__ == "__main__":
    sys.exit(main())
