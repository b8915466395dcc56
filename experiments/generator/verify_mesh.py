"""Verify the I-RAVEN-Mesh generator at scale (docs/generator.md, "Mesh"): validity, context-blind bias, line-count
histograms beside the reference's, and the generation rate of Mesh vs plain balanced I-RAVEN.

    .venv/bin/python experiments/generator/verify_mesh.py [--per-config 2000] [--image-per-config 2000] [--seed 2024]
                                          [--rate-per-config 60] [--rate-rounds 3]

Part 1, per configuration, ``--per-config`` Mesh problems (``generate_problems(..., regime="I-RAVEN-Mesh")``,
splits 6/2/2 by index):

* validity: exactly one candidate satisfies every rule (``validity.satisfying_candidates``); no two candidates
  share a rendered key; for the first ``--image-per-config`` problems the 8 candidate images are rendered and
  must all differ;
* the Mesh quota: among problems with more than 3 modifiable attributes, how many perturb 1 and 2 Mesh
  attributes; and how often raven-datasets' "first Number goes last" order would have put a Number before its
  own component's Position (the case our stable partition fixes, docs/generator.md "Mesh");
* the context-blind probe (``bias.context_blind_choice``) on all problems, with the 99 % interval of chance.

Part 2: Mesh line counts of the first panel and of all 16 panels, beside the exact first-panel distribution
implied by the rule table and the 9-line clamp, and beside the reference counts of 700 raven-datasets problems
(docs/generator.md, "Mesh"): chi-square tests and the largest difference of proportions.

Part 3: problems/s of generation alone and end to end (generate, render, write .npz + .xml) for plain balanced
I-RAVEN and I-RAVEN-Mesh, interleaved per configuration, best CPU time of ``--rate-rounds`` rounds (one OpenCV
thread), ``--rate-per-config`` problems per configuration and kind. The target is Mesh >= 0.8x plain.

Part 5, the candidates-only line-count signal (docs/generator.md, "Line counts the candidates do not give
away"): per configuration, how many lines the distractors have more than the answer (mean, shares of more /
fewer), how often "fewest lines" and "fewest dark pixels" (pixels < 128 of the rendered 160 px candidate; ties
split) pick the answer, for the default (balanced) Mesh, for ``--mode mesh-faithful`` (raven-datasets' draws,
``--per-config`` problems, all rendered) and, with ``--reference-run``, for raven-datasets' own files.

Part 4 (``--reference-run DIR``, optional): a folder written by raven-datasets itself (commit 10815d9,
``python main.py --save-dir DIR --seed 7 --mesh 2 --num-samples 500``) read back with ``xml_io``: every panel
re-rendered and compared with the .npz, the labels rebuilt, the answer's uniqueness, and the reference's own
rates of look-alike candidates, of panels with two entities on one slot and of its Mesh quota.

Prints Markdown tables and the command line; exits 1 when a validity check fails.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
from scipy.stats import chi2, chi2_contingency, chisquare

from rpm_lib.generator import candidates as candidates_module
from rpm_lib.generator.api import generate_problem, generate_problems, problem_rng
from rpm_lib.generator.bias import chance_interval, context_blind_choice
from rpm_lib.generator.candidates import modifiable_attributes
from rpm_lib.generator.lookalikes import has_lookalikes
from rpm_lib.generator.constants import COLOR_MAX_LEVEL, FRESH_NUMBER_MAX_LEVEL, mesh_component_index
from rpm_lib.generator.regimes import split_of
from rpm_lib.generator.render import SPRITES, render_problem
from rpm_lib.generator.sampling import pruned_ranges, regime_rule_table
from rpm_lib.generator.writer import problem_stem, write_problem
from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES

MESH = "I-RAVEN-Mesh"
DARK = 128  # a pixel darker than this counts as ink
TARGET_RATIO = 0.8
LINES = range(1, 13)

#: raven-datasets (commit 10815d9), ``python main.py --seed 42 --mesh 2 --num-samples 100`` (700 problems): Mesh
#: line counts over all 16 panels of every problem, and of the first panel (docs/generator.md, "Mesh"; counted
#: from the run's .xml files, which equal the published reference files of that command).
REFERENCE_ALL_PANELS = {1: 1039, 2: 1222, 3: 1149, 4: 1121, 5: 1165, 6: 1098, 7: 1140, 8: 1119, 9: 957, 10: 492,
                        11: 422, 12: 276}
REFERENCE_FIRST_PANEL = {1: 59, 2: 75, 3: 75, 4: 74, 5: 78, 6: 82, 7: 109, 8: 86, 9: 62}
REFERENCE_PROBLEMS = 700
#: A larger run of the same generator, ``python main.py --seed 7 --mesh 2 --num-samples 500`` (3500 problems).
REFERENCE2_ALL_PANELS = {1: 5731, 2: 5650, 3: 6063, 4: 5474, 5: 5694, 6: 5752, 7: 5760, 8: 5297, 9: 4869, 10: 2405,
                         11: 1975, 12: 1330}
REFERENCE2_FIRST_PANEL = {1: 341, 2: 348, 3: 363, 4: 371, 5: 382, 6: 415, 7: 442, 8: 449, 9: 389}
REFERENCE2_PROBLEMS = 3500


# ---------------------------------------------------------------------------------------------------------
# Part 1
# ---------------------------------------------------------------------------------------------------------


class _SelectionRecorder:
    """Wraps ``candidates.select_attributes`` to see each balanced tree's selected attributes."""

    def __init__(self) -> None:
        self.original = candidates_module.select_attributes
        self.last: list | None = None

    def __call__(self, entries, mesh_component, s):
        selected = self.original(entries, mesh_component, s)
        self.last = list(selected)  # a copy: the caller reorders the list in place
        return selected

    def __enter__(self) -> "_SelectionRecorder":
        candidates_module.select_attributes = self
        return self

    def __exit__(self, *exc) -> None:
        candidates_module.select_attributes = self.original


def _reference_order_breaks(selected: list) -> bool:
    """Whether raven-datasets' order (swap the first Number with the last entry) applies a Number before the
    Position of the same component."""
    order = list(selected)
    numbers = [i for i, e in enumerate(order) if e.attr == "Number"]
    if numbers:
        i = numbers[0]
        order[i], order[-1] = order[-1], order[i]
    for i, entry in enumerate(order):
        if entry.attr == "Number" and any(later.attr == "Position" and later.component == entry.component
                                          for later in order[i + 1:]):
            return True
    return False


def check_problems(per_config: int, image_per_config: int, seed: int) -> dict:
    from rpm_lib.generator.validity import satisfying_candidates

    tie_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB1A5]))
    rows, first, every, per_problem = [], Counter(), Counter(), []
    probe_hits = probe_total = 0
    quota, order_breaks, trees, black_filled = Counter(), 0, 0, 0
    leak = LeakStats()
    for configuration in CONFIGURATIONS:
        mesh = mesh_component_index(configuration)
        valid = lookalike = image_checked = image_equal = hits = 0
        began = time.perf_counter()
        with _SelectionRecorder() as recorder:
            for k, p in enumerate(generate_problems(configuration, per_config, seed=seed, regime=MESH)):
                trees += 1
                order_breaks += _reference_order_breaks(recorder.last)
                valid += satisfying_candidates(p) == [p.target]
                lookalike += has_lookalikes(p.candidates)
                black_filled += any(e.color == COLOR_MAX_LEVEL for panel in p.candidates
                                    for comp in panel.components[:-1] for e in comp.entities)
                image = None
                if k < image_per_config:
                    image = render_problem(p)
                    image_checked += 1
                    image_equal += len({image[8 + j].tobytes() for j in range(8)}) < 8
                leak.add(configuration, [len(c.components[-1].slots) for c in p.candidates], p.target,
                         None if image is None else image[8:])
                hits += context_blind_choice(p.candidates, tie_rng) == p.target
                first[len(p.context[0].components[-1].slots)] += 1
                counts = np.zeros(len(LINES), np.int64)
                for panel in p.panels:
                    every[len(panel.components[-1].slots)] += 1
                    counts[len(panel.components[-1].slots) - 1] += 1
                per_problem.append(counts)
                ranges = [pruned_ranges(c.layout, p.rules[4 * i: 4 * i + 4]) for i, c in enumerate(p.answer.components)]
                if len(modifiable_attributes(p.rules, ranges, p.answer)) > 3:
                    changed = {pair for path in p.modified for pair in path}
                    quota[sum(component == mesh for component, _ in changed)] += 1
        rows.append({"configuration": configuration, "valid": valid, "lookalike": lookalike,
                     "image_checked": image_checked, "image_equal": image_equal, "probe": hits,
                     "seconds": time.perf_counter() - began})
        probe_hits += hits
        probe_total += per_config
        print(f"  {configuration}: done", file=sys.stderr, flush=True)
    return {"rows": rows, "first": first, "every": every, "per_problem": np.array(per_problem),
            "probe_hits": probe_hits, "probe_total": probe_total,
            "quota": quota, "order_breaks": order_breaks, "trees": trees, "black_filled": black_filled,
            "leak": leak}


class LeakStats:
    """Candidates-only statistics of the Mesh line counts (and of the ink, when images are given)."""

    def __init__(self) -> None:
        self.problems = self.imaged = 0
        self.difference: Counter = Counter()  # distractor lines - answer lines, over all distractors
        self.per_configuration: dict[str, list] = {}
        self.fewest_lines = self.fewest_ink = 0.0
        self.ink_answer = self.ink_distractor = 0.0

    def add(self, configuration: str, lines: list[int], target: int, candidates: np.ndarray | None = None) -> None:
        row = self.per_configuration.setdefault(configuration, [0, Counter(), 0.0])
        row[0] += 1
        self.problems += 1
        for j, count in enumerate(lines):
            if j != target:
                self.difference[count - lines[target]] += 1
                row[1][count - lines[target]] += 1
        fewest = [j for j, count in enumerate(lines) if count == min(lines)]
        hit = (target in fewest) / len(fewest)
        self.fewest_lines += hit
        row[2] += hit
        if candidates is not None:
            ink = (candidates < DARK).sum(axis=(1, 2))
            least = np.flatnonzero(ink == ink.min())
            self.fewest_ink += (target in least) / len(least)
            self.ink_answer += float(ink[target])
            self.ink_distractor += float((ink.sum() - ink[target]) / 7)
            self.imaged += 1

    def summary(self) -> dict:
        distractors = sum(self.difference.values())
        return {"problems": self.problems,
                "mean_difference": sum(d * n for d, n in self.difference.items()) / distractors,
                "more": sum(n for d, n in self.difference.items() if d > 0) / distractors,
                "fewer": sum(n for d, n in self.difference.items() if d < 0) / distractors,
                "fewest_lines": self.fewest_lines / self.problems,
                "imaged": self.imaged,
                "fewest_ink": self.fewest_ink / self.imaged if self.imaged else float("nan"),
                "ink_answer": self.ink_answer / self.imaged if self.imaged else float("nan"),
                "ink_distractor": self.ink_distractor / self.imaged if self.imaged else float("nan")}


def leak_of_mode(per_config: int, seed: int, mode: str, render: bool = True) -> LeakStats:
    """:class:`LeakStats` of ``per_config`` Mesh problems per configuration in ``mode``."""
    stats = LeakStats()
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, per_config, seed=seed, regime=MESH, mode=mode):
            image = render_problem(p)[8:] if render else None
            stats.add(configuration, [len(c.components[-1].slots) for c in p.candidates], p.target, image)
    return stats


def _leak_table(sources: dict[str, LeakStats]) -> str:
    lines = ["| source | problems | distractor - answer lines, mean | distractors with more / fewer lines | "
             "'fewest lines' picks the answer | mean dark px answer / distractor | 'fewest dark px' picks the "
             "answer |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, stats in sources.items():
        r = stats.summary()
        lines.append(f"| {name} | {r['problems']} | {r['mean_difference']:+.3f} | {100 * r['more']:.1f} % / "
                     f"{100 * r['fewer']:.1f} % | {100 * r['fewest_lines']:.2f} % | {r['ink_answer']:.0f} / "
                     f"{r['ink_distractor']:.0f} | {100 * r['fewest_ink']:.2f} % |")
    lines += ["", "Per configuration, mean (distractor - answer lines) and 'fewest lines' hit rate:", "",
              "| configuration | " + " | ".join(sources) + " |", "|---|" + "---:|" * len(sources)]
    for configuration in CONFIGURATIONS:
        cells = []
        for stats in sources.values():
            n, difference, hits = stats.per_configuration.get(configuration, (0, Counter(), 0.0))
            total = sum(difference.values())
            cells.append(f"{sum(d * k for d, k in difference.items()) / total:+.2f}, {100 * hits / n:.1f} %"
                         if n else "-")
        lines.append(f"| {SHORT_NAMES[configuration]} | " + " | ".join(cells) + " |")
    lines += ["", "Distractor - answer lines over all distractors (% of distractors):", "",
              "| source | " + " | ".join(f"{d:+d}" for d in range(-11, 12)) + " |", "|---|" + "---:|" * 23]
    for name, stats in sources.items():
        total = sum(stats.difference.values())
        lines.append(f"| {name} | " + " | ".join(f"{100 * stats.difference[d] / total:.1f}" for d in range(-11, 12))
                     + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Part 2
# ---------------------------------------------------------------------------------------------------------


def exact_first_panel() -> dict[int, Fraction]:
    """P(first panel has n lines) from the Mesh rule table and the fresh-count clamp (uniform level in the
    pruned start range clamped at ``FRESH_NUMBER_MAX_LEVEL``)."""
    distribution: Counter = Counter()
    for option in regime_rule_table("center_single", 1, 0, "train", MESH):
        low, high = option.start[0], min(option.start[1], FRESH_NUMBER_MAX_LEVEL)
        for level in range(low, high + 1):
            distribution[level + 1] += option.probability / (high - low + 1)
    return dict(distribution)


def design_effect(per_problem: np.ndarray) -> float:
    """How much the 16 panels of a problem are correlated (their counts share rules and candidates): the mean
    over line counts of the variance of a proportion estimated over whole problems, divided by its binomial
    variance over independent panels. Chi-square statistics over panels are divided by it (Rao-Scott)."""
    panels = per_problem.sum(axis=1)[0]
    share = per_problem.sum(axis=0) / per_problem.sum()
    clustered = per_problem.var(axis=0, ddof=1) / (len(per_problem) * panels ** 2)
    binomial = share * (1 - share) / per_problem.sum()
    return float(np.mean(clustered[binomial > 0] / binomial[binomial > 0]))


def _first_panel_table(first: Counter) -> tuple[str, dict]:
    n_first = sum(first.values())
    exact = exact_first_panel()
    lines = ["| lines | ours | ours % | exact % (rule table + clamp) | reference 700 % | reference 3500 % |",
             "|---:|---:|---:|---:|---:|---:|"]
    for n in LINES:
        lines.append(f"| {n} | {first[n]} | {100 * first[n] / n_first:.2f} | {100 * float(exact.get(n, 0)):.2f} | "
                     f"{100 * REFERENCE_FIRST_PANEL.get(n, 0) / REFERENCE_PROBLEMS:.2f} | "
                     f"{100 * REFERENCE2_FIRST_PANEL.get(n, 0) / REFERENCE2_PROBLEMS:.2f} |")
    support = range(1, 10)
    expected = [float(exact.get(n, 0)) for n in support]

    def fit(counts: list[int]) -> float:
        return chisquare(counts, [p * sum(counts) for p in expected]).pvalue

    stats = {"ours": fit([first[n] for n in support]),
             "reference": fit([REFERENCE_FIRST_PANEL[n] for n in support]),
             "reference2": fit([REFERENCE2_FIRST_PANEL[n] for n in support]),
             "versus_reference2": chi2_contingency([[first[n] for n in support],
                                                    [REFERENCE2_FIRST_PANEL[n] for n in support]]).pvalue,
             "beyond_9": sum(first[n] for n in range(10, 13))}
    return "\n".join(lines), stats


def _all_panels_table(every: Counter, deff: float) -> tuple[str, dict]:
    n_every = sum(every.values())
    totals = {"ref": sum(REFERENCE_ALL_PANELS.values()), "ref2": sum(REFERENCE2_ALL_PANELS.values())}
    lines = ["| lines | ours | ours % | reference 700 % | reference 3500 % | ours - reference 3500 (points) |",
             "|---:|---:|---:|---:|---:|---:|"]
    differences = []
    for n in LINES:
        ours = every[n] / n_every
        ref, ref2 = REFERENCE_ALL_PANELS[n] / totals["ref"], REFERENCE2_ALL_PANELS[n] / totals["ref2"]
        differences.append(max(abs(ours - ref), abs(ours - ref2)))
        lines.append(f"| {n} | {every[n]} | {100 * ours:.2f} | {100 * ref:.2f} | {100 * ref2:.2f} | "
                     f"{100 * (ours - ref2):+.2f} |")

    def compare(a: dict, b: dict) -> tuple[float, float]:
        test = chi2_contingency([[a[n] for n in LINES], [b[n] for n in LINES]])
        return test.pvalue, float(chi2.sf(test.statistic / deff, test.dof))

    stats = {"versus_reference": compare(every, REFERENCE_ALL_PANELS),
             "versus_reference2": compare(every, REFERENCE2_ALL_PANELS),
             "references": compare(REFERENCE_ALL_PANELS, REFERENCE2_ALL_PANELS),
             "max_diff": max(differences)}
    return "\n".join(lines), stats


# ---------------------------------------------------------------------------------------------------------
# Part 3
# ---------------------------------------------------------------------------------------------------------


def _timed(root: Path, configuration: str, regime: str | None, per_config: int, seed: int) -> tuple[float, float, int]:
    """CPU seconds of generation alone and of generate + render + write, and .xml bytes written."""
    began = time.process_time()
    for k in range(per_config):
        generate_problem(configuration, problem_rng(seed, configuration, k), "balanced", regime, split_of(k))
    generation = time.process_time() - began
    (root / configuration).mkdir(parents=True, exist_ok=True)
    SPRITES.clear()  # each kind pays the same sprite warm-up
    began = time.process_time()
    for k in range(per_config):
        problem = generate_problem(configuration, problem_rng(seed, configuration, k), "balanced", regime, split_of(k))
        write_problem(problem, problem_stem(root, configuration, k), image=render_problem(problem))
    total = time.process_time() - began
    xml_bytes = sum(path.stat().st_size for path in (root / configuration).glob("*.xml"))
    return generation, total, xml_bytes


def bench_rates(per_config: int, rounds: int, seed: int) -> dict:
    cv2.setNumThreads(1)
    kinds = {"I-RAVEN": None, MESH: MESH}
    best_generation = {(k, c): float("inf") for k in kinds for c in CONFIGURATIONS}
    best_total = dict(best_generation)
    xml = {k: 0 for k in kinds}
    with tempfile.TemporaryDirectory(prefix="verify_mesh_") as temp:
        for round_ in range(rounds):
            for configuration in CONFIGURATIONS:
                order = list(kinds) if round_ % 2 == 0 else list(kinds)[::-1]
                for name in order:
                    folder = Path(temp) / name
                    generation, total, xml_bytes = _timed(folder, configuration, kinds[name], per_config, seed)
                    key = (name, configuration)
                    best_generation[key] = min(best_generation[key], generation)
                    best_total[key] = min(best_total[key], total)
                    if round_ == 0:
                        xml[name] += xml_bytes
                    shutil.rmtree(folder, ignore_errors=True)
            print(f"  rate round {round_ + 1}/{rounds} done", file=sys.stderr, flush=True)
    count = per_config * len(CONFIGURATIONS)
    rates = {name: {"generation": count / sum(best_generation[name, c] for c in CONFIGURATIONS),
                    "total": count / sum(best_total[name, c] for c in CONFIGURATIONS),
                    "xml_kb": xml[name] / count / 1024,
                    "per_configuration": {c: per_config / best_total[name, c] for c in CONFIGURATIONS}}
             for name in kinds}
    return rates


# ---------------------------------------------------------------------------------------------------------
# Part 4
# ---------------------------------------------------------------------------------------------------------


def check_reference_run(folder: Path) -> dict:
    """Read a raven-datasets Mesh folder back: re-rendering, labels, uniqueness and the reference's own quirks."""
    from rpm_lib.generator.labels import problem_labels
    from rpm_lib.generator.validity import satisfying_candidates
    from rpm_lib.generator.xml_io import read_problem_xml

    paths = sorted(folder.glob("*/RAVEN_*.xml"))
    if not paths:
        raise SystemExit(f"--reference-run: no */RAVEN_*.xml under {folder}")
    found = Counter()
    leak = LeakStats()
    for path in paths:
        problem = read_problem_xml(path)
        with np.load(path.with_suffix(".npz")) as data:
            stored = {key: data[key] for key in data.files}
        leak.add(problem.configuration, [len(c.components[-1].slots) for c in problem.candidates], problem.target,
                 stored["image"][8:])
        same = (render_problem(problem) == stored["image"]).all(axis=(1, 2))
        found["panels"] += same.size
        found["panels_equal"] += int(same.sum())
        labels = problem_labels(problem)
        found["labels_equal"] += all(value.dtype == stored[key].dtype and np.array_equal(value, stored[key])
                                     for key, value in labels.items())
        found["unique"] += satisfying_candidates(problem) == [problem.target]
        found["equal_images"] += len({stored["image"][8 + j].tobytes() for j in range(8)}) < 8
        found["shared_slot"] += any(len(set(c.slots)) < len(c.slots) for panel in problem.panels
                                    for c in panel.components)
        mesh = len(problem.rules) // 4 - 1
        changed = {pair for path_ in problem.modified for pair in path_}
        if len(changed) == 3:
            found[f"quota_{sum(component == mesh for component, _ in changed)}"] += 1
        found[f"rule {problem.rules[-4].name} {problem.rules[-4].attr}"] += 1
        found["problems"] += 1
    found = dict(found)
    found["leak"] = leak
    return found


# ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-config", type=int, default=2000, help="Mesh problems per configuration (part 1)")
    parser.add_argument("--image-per-config", type=int, default=2000,
                        help="of those, how many get their candidate images rendered and compared")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--rate-per-config", type=int, default=60, help="problems per configuration and kind (part 3)")
    parser.add_argument("--rate-rounds", type=int, default=3)
    parser.add_argument("--skip-rates", action="store_true")
    parser.add_argument("--faithful-per-config", type=int, default=None, metavar="N",
                        help="Mesh problems per configuration in mode mesh-faithful for part 5 (default: --per-config)")
    parser.add_argument("--reference-run", type=Path, default=None, metavar="DIR",
                        help="also read back a folder written by raven-datasets with --mesh 2 (part 4)")
    args = parser.parse_args(argv)
    for name in ("per_config", "image_per_config", "rate_per_config", "rate_rounds"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.per_config < 1:
        parser.error("--per-config must be >= 1")

    print(f"`{' '.join(['.venv/bin/python', 'experiments/generator/verify_mesh.py'] + (argv if argv is not None else sys.argv[1:]))}`")
    print(f"machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs, Python "
          f"{platform.python_version()}, numpy {np.__version__}, OpenCV {cv2.__version__}\n")

    result = check_problems(args.per_config, args.image_per_config, args.seed)
    failed = False
    print(f"## Part 1: {args.per_config} Mesh problems per configuration (seed {args.seed})\n")
    print("| configuration | exactly one valid candidate | look-alike keys | images checked | two equal candidate "
          "images | context-blind probe | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in result["rows"]:
        n = args.per_config
        failed |= row["valid"] != n or row["lookalike"] or row["image_equal"]
        print(f"| {SHORT_NAMES[row['configuration']]} | {row['valid']}/{n} | {row['lookalike']} | "
              f"{row['image_checked']} | {row['image_equal']} | {100 * row['probe'] / n:.2f} % | {row['seconds']:.1f} |")
    low, high = chance_interval(result["probe_total"])
    accuracy = result["probe_hits"] / result["probe_total"]
    verdict = "within" if low <= accuracy <= high else "OUTSIDE"
    failed |= verdict != "within"
    print(f"\ncontext-blind probe over all {result['probe_total']} problems: {100 * accuracy:.2f} % "
          f"({result['probe_hits']}), 99 % interval of chance [{100 * low:.2f} %, {100 * high:.2f} %]: {verdict}")
    quota = result["quota"]
    print(f"Mesh quota (problems with > 3 modifiable attributes: {sum(quota.values())}): "
          + ", ".join(f"{m} Mesh attribute(s) perturbed: {quota[m]}" for m in sorted(quota)))
    failed |= set(quota) - {1, 2} != set()
    print(f"raven-datasets' order would apply a Number before its component's Position in {result['order_breaks']} "
          f"of {result['trees']} candidate trees ({100 * result['order_breaks'] / result['trees']:.2f} %)")
    print(f"final candidate sets with a black-filled shape (where has_hidden_lookalikes renders): "
          f"{result['black_filled']} ({100 * result['black_filled'] / result['trees']:.1f} %)\n")

    first_table, first_stats = _first_panel_table(result["first"])
    deff = design_effect(result["per_problem"])
    every_table, every_stats = _all_panels_table(result["every"], deff)
    print("## Part 2: Mesh line counts (references: raven-datasets 10815d9 with --mesh 2, seed 42 x 100 and seed 7 "
          "x 500 problems per configuration)\n")
    print(f"First panel ({sum(result['first'].values())} problems):\n\n{first_table}\n")
    print(f"chi-square vs the exact distribution (1..9 lines): ours p = {first_stats['ours']:.3f}, reference 700 "
          f"p = {first_stats['reference']:.3f}, reference 3500 p = {first_stats['reference2']:.3f}; two-sample ours vs "
          f"reference 3500 p = {first_stats['versus_reference2']:.3f}; first panels with more than 9 lines: "
          f"{first_stats['beyond_9']}\n")
    failed |= first_stats["beyond_9"] > 0
    print(f"All 16 panels ({sum(result['every'].values())} panels):\n\n{every_table}\n")
    print(f"two-sample chi-square over panels, p raw / Rao-Scott adjusted for the panels of one problem being "
          f"correlated (design effect {deff:.2f}, measured on ours): ours vs reference 700 "
          f"{every_stats['versus_reference'][0]:.3g} / {every_stats['versus_reference'][1]:.3g}; ours vs reference "
          f"3500 {every_stats['versus_reference2'][0]:.3g} / {every_stats['versus_reference2'][1]:.3g}; the two "
          f"references {every_stats['references'][0]:.3g} / {every_stats['references'][1]:.3g}. Largest difference "
          f"of proportions to either reference: {100 * every_stats['max_diff']:.2f} points\n")

    if not args.skip_rates and args.rate_per_config and args.rate_rounds:
        rates = bench_rates(args.rate_per_config, args.rate_rounds, args.seed)
        plain, mesh = rates["I-RAVEN"], rates[MESH]
        print(f"## Part 3: generation rate ({args.rate_per_config} problems per configuration and kind, best CPU "
              f"time of {args.rate_rounds} interleaved rounds)\n")
        print("| kind | generation alone, problems/s | end to end (generate, render, write), problems/s | "
              "mean .xml KB |")
        print("|---|---:|---:|---:|")
        for name, rate in rates.items():
            print(f"| {name} | {rate['generation']:.0f} | {rate['total']:.0f} | {rate['xml_kb']:.0f} |")
        ratio = mesh["total"] / plain["total"]
        print(f"| ratio Mesh / plain | {mesh['generation'] / plain['generation']:.2f} | {ratio:.2f} | |\n")
        print("end to end per configuration (problems/s, plain -> Mesh): " + ", ".join(
            f"{SHORT_NAMES[c]} {plain['per_configuration'][c]:.0f} -> {mesh['per_configuration'][c]:.0f}"
            for c in CONFIGURATIONS))
        print(f"\ntarget: Mesh >= {TARGET_RATIO}x plain end to end: {'met' if ratio >= TARGET_RATIO else 'NOT met'}")
    found = check_reference_run(args.reference_run) if args.reference_run is not None else None
    faithful_count = args.per_config if args.faithful_per_config is None else args.faithful_per_config
    sources = {"ours (balanced, default)": result["leak"]}
    if faithful_count > 0:
        sources["ours (mesh-faithful)"] = leak_of_mode(faithful_count, args.seed, "mesh-faithful")
    if found is not None:
        sources["raven-datasets"] = found["leak"]
    print("\n## Part 5: line counts of the candidates alone (docs/generator.md, \"Line counts the candidates do not "
          "give away\")\n")
    low, high = chance_interval(result["leak"].problems)
    print(f"{_leak_table(sources)}\n\n99 % interval of chance for {result['leak'].problems} problems: "
          f"[{100 * low:.2f} %, {100 * high:.2f} %]")
    balanced = result["leak"].summary()
    failed |= not low <= balanced["fewest_lines"] <= high
    if balanced["imaged"]:
        low_i, high_i = chance_interval(balanced["imaged"])
        failed |= not low_i <= balanced["fewest_ink"] <= high_i
    if found is not None:
        n = found["problems"]
        print(f"\n## Part 4: raven-datasets' own Mesh files read back ({n} problems in {args.reference_run})\n")
        print(f"* panels re-rendered pixel-exactly: {found['panels_equal']} of {found['panels']}")
        print(f"* labels (meta_matrix, meta_target, structure, meta_structure) rebuilt exactly: {found['labels_equal']} "
              f"of {n}")
        print(f"* exactly one candidate satisfies every rule: {found['unique']} of {n}")
        print(f"* two candidate images equal: {found['equal_images']} ({100 * found['equal_images'] / n:.2f} %)")
        print(f"* a panel with two entities on one slot: {found['shared_slot']} ({100 * found['shared_slot'] / n:.2f} %)")
        quota = {m: found.get(f"quota_{m}", 0) for m in (0, 1, 2, 3)}
        trees = sum(quota.values())
        print(f"* Mesh quota among candidate trees over 3 attributes ({trees}): " + ", ".join(
            f"{m} Mesh attribute(s) {quota[m]} ({100 * quota[m] / trees:.1f} %)" for m in quota if quota[m]))
        print("* Mesh Number/Position rules: " + ", ".join(
            f"{key[5:]} {value}" for key, value in sorted(found.items()) if key.startswith("rule ")))
        failed |= found["panels_equal"] != found["panels"] or found["labels_equal"] != n
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
