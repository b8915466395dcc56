"""Context-blind bias probe: can the answer be found from the 8 candidates alone?

See docs/generator.md, "Context-blind bias" (and "Original candidates (RAVEN)" vs "Balanced candidates (I-RAVEN)").

The probe never looks at the context. For each candidate and each (component, attribute) -- Number (count),
Position (occupied slot set), Type, Size and Color (sorted levels of the entities) -- it counts how many of the
8 candidates share that value, sums the counts, and picks the candidate with the largest sum (ties broken
by a seeded Generator). In RAVEN (``mode="original"``) every distractor changes one attribute of the answer,
so the answer is the mode and the probe scores far above chance; in I-RAVEN (``mode="balanced"``) every
value appears in exactly half of the candidates and the probe should score 1/8 up to sampling error. RAVEN-FAIR
(``mode="fair"``) grows its distractors as a tree of one-attribute changes from the answer; docs/generator.md,
"RAVEN-FAIR", gives the probe's score on it.

Mesh problems (docs/generator.md, "Mesh"): the Mesh is one more component, so its Number and Position (and
its single-valued Type/Size/Color, the same for every candidate) enter the sums like any other component's;
``--regime I-RAVEN-Mesh`` runs the probe on them (balanced modes only: RAVEN's and RAVEN-FAIR's candidates have no
Mesh).

Run: ``python -m rpm_lib.generator.bias --count 2000`` (problems per mode, spread round-robin over the 7
configurations); prints each mode's accuracy and the 99% binomial interval of chance.
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import binom

from rpm_lib.cli_parser import OneLineArgumentParser
from rpm_lib.generator.api import MODES, generate_problem, problem_rng
from rpm_lib.generator.candidates import FAIR, MESH_FAITHFUL
from rpm_lib.generator.problem import Panel
from rpm_lib.generator.regimes import resolve_regime
from rpm_lib.rules import CONFIGURATIONS

__all__ = [
    "CHANCE",
    "candidate_features",
    "context_blind_choice",
    "ProbeResult",
    "run_probe",
    "chance_interval",
    "main",
]

#: Chance level with 8 candidates.
CHANCE = 1 / 8


def candidate_features(panel: Panel) -> list[tuple]:
    """The attribute values the probe compares: per component Number, Position, Type, Size, Color."""
    features: list[tuple] = []
    for c, comp in enumerate(panel.components):
        features.append((c, "Number", len(comp.slots)))
        features.append((c, "Position", frozenset(comp.slots)))
        features.append((c, "Type", tuple(sorted(e.type for e in comp.entities))))
        features.append((c, "Size", tuple(sorted(e.size for e in comp.entities))))
        features.append((c, "Color", tuple(sorted(e.color for e in comp.entities))))
    return features


def context_blind_choice(candidates: Sequence[Panel], rng: np.random.Generator) -> int:
    """Index of the candidate whose attribute values are shared by the most candidates (ties: random)."""
    features = [candidate_features(panel) for panel in candidates]
    frequency = Counter(f for feats in features for f in feats)
    scores = [sum(frequency[f] for f in feats) for feats in features]
    best = max(scores)
    tied = [k for k, score in enumerate(scores) if score == best]
    return tied[int(rng.integers(len(tied)))]


@dataclass
class ProbeResult:
    """Accuracy of the probe on ``total`` problems of one mode (``per_configuration``: correct, total)."""

    mode: str
    correct: int
    total: int
    per_configuration: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


def run_probe(
    mode: str, count: int, seed: int = 1234, configurations: Sequence[str] = CONFIGURATIONS, regime=None
) -> ProbeResult:
    """Generate ``count`` problems (problem k: configuration ``k % len(configurations)``, index
    ``k // len(configurations)``) and score the context-blind probe on them. ``regime``: as in
    ``api.generate_problem`` (e.g. ``"I-RAVEN-Mesh"``; None = plain I-RAVEN / RAVEN); problems are drawn in
    the train split."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    tie_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB1A5]))
    result = ProbeResult(mode, 0, 0, {name: (0, 0) for name in configurations})
    for k in range(count):
        configuration = configurations[k % len(configurations)]
        rng = problem_rng(seed, configuration, k // len(configurations))
        problem = generate_problem(configuration, rng, mode) if regime is None else \
            generate_problem(configuration, rng, mode, regime=regime)
        hit = int(context_blind_choice(problem.candidates, tie_rng) == problem.target)
        result.correct += hit
        result.total += 1
        right, seen = result.per_configuration[configuration]
        result.per_configuration[configuration] = (right + hit, seen + 1)
    return result


def chance_interval(total: int, level: float = 0.99) -> tuple[float, float]:
    """Central ``level`` interval of the accuracy of a 1/8 guesser on ``total`` problems."""
    low, high = binom.interval(level, total, CHANCE)
    return low / total, high / total


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineArgumentParser(
        prog="python -m rpm_lib.generator.bias", description="Context-blind bias probe of the generator."
    )
    parser.add_argument("--count", type=int, default=2000, help="problems per mode (default 2000)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--configuration", action="append", choices=CONFIGURATIONS,
        help="restrict to these configurations (repeatable; default all 7)",
    )
    parser.add_argument("--regime", default=None,
                        help="a generator regime, e.g. I-RAVEN-Mesh (default: plain I-RAVEN / RAVEN)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count {args.count}: give at least 1 problem per mode")
    if args.seed < 0:
        parser.error(f"--seed {args.seed}: a seed is a non-negative integer")
    configurations = tuple(args.configuration) if args.configuration else CONFIGURATIONS
    low, high = chance_interval(args.count)
    print(f"context-blind probe, {args.count} problems per mode, seed {args.seed}"
          + (f", regime {args.regime}" if args.regime else ""))
    print(f"chance 12.5%, 99% binomial interval [{100 * low:.2f}%, {100 * high:.2f}%]")
    try:
        mesh = resolve_regime(args.regime).mesh
    except ValueError as error:
        parser.error(f"--regime: {error}")
    for mode in MODES:
        if mesh and mode in ("original", FAIR):
            print(f"{mode:>9}: not defined for Mesh problems (skipped)")
            continue
        if not mesh and mode == MESH_FAITHFUL:  # only differs from balanced with the Mesh
            continue
        result = run_probe(mode, args.count, args.seed, configurations, args.regime)
        where = "within" if low <= result.accuracy <= high else ("above" if result.accuracy > high else "below")
        print(f"{mode:>9}: {100 * result.accuracy:6.2f}% ({result.correct}/{result.total}, {where} the chance interval)")
        for name, (right, seen) in result.per_configuration.items():
            if seen:
                print(f"           {name:<40} {100 * right / seen:6.2f}% ({right}/{seen})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
