"""Verify generated regime problems at scale: one answer, distinct candidate images, no context-blind shortcut.

    .venv/bin/python experiments/generator/verify_regimes.py [--regime A/Color ...] [--count 2000] [--split mixed|test|train]
        [--render-count N] [--seed 1234]

For each regime (default: the 4 primary A-I-RAVEN regimes) and each configuration, ``--count`` balanced
problems k = 0 .. count-1 (``problem_rng(seed, configuration, k)``), each in the split the writer files it under
(``--split mixed``: ``split_of(k)``, 6/2/2) or all in one split (``--split test``: only the
out-of-distribution rules; ``--split train``). Per problem:

* the held-out groups' rules lie in the regime's table for that split (``sampling.regime_rule_table``);
* validity (``validity.satisfying_candidates``): exactly one candidate, the target, satisfies every rule;
* for the first ``--render-count`` problems per configuration (default: all): the 8 candidates render to 8
  different images (``render.render_panel``, pixel bytes compared);
* the context-blind probe (``bias.context_blind_choice``) picks the target at chance: accuracy per regime
  against the 99 % binomial interval of a 1/8 guesser (``bias.chance_interval``);
* train-like problems: how often some candidate differs from the answer in a held-out attribute
  (``Problem.modified``) -- the held-out attribute must still vary among the distractors.

Prints Markdown tables and the command line; exit status 1 if a check fails (probe outside its interval
included).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.bias import CHANCE, chance_interval, context_blind_choice
from rpm_lib.generator.constants import CONFIG_SPECS
from rpm_lib.generator.regimes import PRIMARY_REGIMES, REGIMES, split_of
from rpm_lib.generator.render import render_panel
from rpm_lib.generator.sampling import regime_rule_table
from rpm_lib.generator.validity import satisfying_candidates
from rpm_lib.rules import ATTRIBUTES, CONFIGURATIONS, RULE_GROUPS, SHORT_NAMES

SPLIT_CHOICES = ("mixed", "train", "test")
# The attributes a rule group governs, as Problem.modified names them (group 0: Number and Position).
_GROUP_ATTRIBUTES = {0: set(ATTRIBUTES[:2]), 1: {ATTRIBUTES[2]}, 2: {ATTRIBUTES[3]}, 3: {ATTRIBUTES[4]}}


def verify(regime_name: str, count: int, split_choice: str, render_count: int, seed: int, bar) -> dict:
    """Counts for one regime over every configuration (see the module docstring)."""
    regime = REGIMES[regime_name]
    held = regime.held_out_rules
    tie_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB1A5]))
    out = {"regime": regime_name, "problems": 0, "bad_rules": 0, "invalid": 0, "rendered": 0, "duplicates": 0,
           "probe_hits": 0, "per_configuration": {}, "first_failure": None}
    for configuration in CONFIGURATIONS:
        n_components = len(CONFIG_SPECS[configuration].components)
        allowed = {(c, g, split): {(o.name, o.attr, o.value)
                                   for o in regime_rule_table(configuration, c, g, split, regime)}
                   for c in range(n_components) for g in held for split in ("train", "test")}
        trainlike = varied = hits = 0
        for k in range(count):
            split = split_of(k) if split_choice == "mixed" else split_choice
            kind = "test" if split == "test" else "train"
            problem = generate_problem(configuration, problem_rng(seed, configuration, k), "balanced", regime, split)
            out["problems"] += 1
            for i, rule in enumerate(problem.rules):
                c, g = divmod(i, 4)
                if g in held and (rule.name, rule.attr, rule.value) not in allowed[c, g, kind]:
                    out["bad_rules"] += 1
                    out["first_failure"] = out["first_failure"] or f"{configuration} k={k}: rule {rule} not in {split}"
            if satisfying_candidates(problem) != [problem.target]:
                out["invalid"] += 1
                out["first_failure"] = out["first_failure"] or f"{configuration} k={k}: not exactly one valid candidate"
            if k < render_count:
                images = {render_panel(configuration, panel).tobytes() for panel in problem.candidates}
                out["rendered"] += 1
                if len(images) != len(problem.candidates):
                    out["duplicates"] += 1
                    out["first_failure"] = out["first_failure"] or f"{configuration} k={k}: two identical candidates"
            hit = int(context_blind_choice(problem.candidates, tie_rng) == problem.target)
            hits += hit
            if kind == "train":
                trainlike += 1
                changed = {attr for mods in problem.modified for _c, attr in mods}
                varied += any(changed & _GROUP_ATTRIBUTES[g] for g in held)
            bar.update(1)
        out["probe_hits"] += hits
        out["per_configuration"][configuration] = {"probe": hits / count, "trainlike": trainlike,
                                                   "varied": varied / trainlike if trainlike else float("nan")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", action="append", choices=list(REGIMES),
                        help=f"regime to verify (repeatable; default: the primary ones, {', '.join(PRIMARY_REGIMES)})")
    parser.add_argument("--count", type=int, default=2000, help="problems per configuration and regime (default 2000)")
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="mixed",
                        help="mixed: each problem in the split the writer files it under (6/2/2, default); "
                             "train / test: every problem in that split")
    parser.add_argument("--render-count", type=int, default=None, metavar="N",
                        help="render the candidates of the first N problems per configuration (default: all)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    render_count = args.count if args.render_count is None else args.render_count
    if render_count < 0:
        parser.error(f"--render-count must be >= 0, got {render_count}")
    names = args.regime or list(PRIMARY_REGIMES)

    import cv2
    from tqdm.auto import tqdm

    cv2.setNumThreads(1)
    began = time.perf_counter()
    results = []
    with tqdm(total=len(names) * len(CONFIGURATIONS) * args.count, unit="problem", disable=args.quiet,
              desc="verify_regimes") as bar:
        for name in names:
            results.append(verify(name, args.count, args.split, render_count, args.seed, bar))
    seconds = time.perf_counter() - began

    print(f"\ncommand: `python experiments/generator/verify_regimes.py {' '.join(sys.argv[1:] if argv is None else argv)}`  ")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}; "
          f"{seconds:.0f} s\n")
    total = args.count * len(CONFIGURATIONS)
    low, high = chance_interval(total)
    print(f"## Regimes: {args.count} balanced problems per configuration, split {args.split}, seed {args.seed}\n")
    print(f"| regime | problems | held-out rule outside its split's table | not exactly one valid candidate | "
          f"rendered | two identical candidate images | context-blind probe | 99 % chance interval | ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---|:---:|")
    failed = False
    for r in results:
        accuracy = r["probe_hits"] / r["problems"]
        ok = (r["bad_rules"] == 0 and r["invalid"] == 0 and r["duplicates"] == 0 and low <= accuracy <= high)
        failed |= not ok
        print(f"| {r['regime']} | {r['problems']} | {r['bad_rules']} | {r['invalid']} | {r['rendered']} | "
              f"{r['duplicates']} | {100 * accuracy:.2f} % | [{100 * low:.2f} %, {100 * high:.2f} %] | "
              f"{'yes' if ok else '**no**'} |")
    print(f"\n(chance = {100 * CHANCE:.1f} %)")
    if args.split != "test":
        print("\n### Held-out attribute changed among the candidates (share of train/val problems)\n")
        print("| regime | held out | " + " | ".join(SHORT_NAMES[c] for c in CONFIGURATIONS) + " |")
        print("|---|---|" + "---:|" * len(CONFIGURATIONS))
        for r in results:
            held = ", ".join(RULE_GROUPS[g] for g in REGIMES[r["regime"]].held_out_rules)
            cells = [f"{100 * r['per_configuration'][c]['varied']:.0f} %" for c in CONFIGURATIONS]
            print(f"| {r['regime']} | {held} | " + " | ".join(cells) + " |")
    print("\n### Context-blind probe per configuration\n")
    low_c, high_c = chance_interval(args.count)
    print(f"(99 % chance interval for {args.count} problems: [{100 * low_c:.2f} %, {100 * high_c:.2f} %])\n")
    print("| regime | " + " | ".join(SHORT_NAMES[c] for c in CONFIGURATIONS) + " |")
    print("|---|" + "---:|" * len(CONFIGURATIONS))
    for r in results:
        cells = [f"{100 * r['per_configuration'][c]['probe']:.1f} %" for c in CONFIGURATIONS]
        print(f"| {r['regime']} | " + " | ".join(cells) + " |")
    for r in results:
        if r["first_failure"]:
            print(f"\nfirst failure in {r['regime']}: {r['first_failure']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
