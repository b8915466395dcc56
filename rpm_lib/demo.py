"""``make demo``: an end-to-end tour of rpm_lib, as a list of named, idempotent steps.

    python -m rpm_lib.demo --out runs/demo [--data data/demo-iraven] [--num-per-config 60] [--seed 1234]

Steps (``--list-steps``; run a subset with ``--steps generate,gallery``):

1. ``generate``: a small balanced I-RAVEN set (all 7 configurations) with ``rpm-generate``'s writer;
   resumable, so a rerun reuses finished files.
2. ``cache``: the 80 px memory-mapped cache of that set (``rpm_lib.data.prepare_cache``), reused
   when it is complete and up to date.
3. ``gallery``: ``<out>/gallery.png``, one RPM per configuration, correct answer framed, rules in words.

Later steps (training, notebooks) are appended to ``STEPS`` by adding a function ``step(ctx)``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@dataclass
class DemoContext:
    """Settings and results shared by the steps.

    Attributes:
        out: run folder (figures, logs), e.g. ``runs/demo``.
        data: raw generated data folder.
        cache: 80 px cache folder (``<data>-80`` by default).
        num_per_config: problems per configuration.
        seed: generator seed.
        workers: processes for generation and caching.
        results: what steps produced (paths, counts), for later steps and the final summary.
    """

    out: Path
    data: Path
    cache: Path
    num_per_config: int = 60
    seed: int = 1234
    workers: int = 1
    results: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DemoStep:
    """A named step: ``run(ctx)`` must be idempotent (reuse finished work on a rerun)."""

    name: str
    description: str
    run: Callable[[DemoContext], None]


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------------


def step_generate(ctx: DemoContext) -> None:
    """Generate ``num_per_config`` balanced problems per configuration into ``ctx.data`` (resumable)."""
    from rpm_lib.generator.writer import write_dataset

    _say(f"generating {ctx.num_per_config} I-RAVEN problems x 7 configurations into {ctx.data} (seed {ctx.seed})")
    summary = write_dataset(ctx.data, "all", count=ctx.num_per_config, seed=ctx.seed, mode="balanced",
                            workers=ctx.workers, progress=True)
    _say(f"data: {summary['written']} written, {summary['skipped']} reused")
    ctx.results["data"] = ctx.data


def step_cache(ctx: DemoContext) -> None:
    """Build the 80 px cache of the generated set (skipped with a message if ``rpm_lib.data`` lacks it)."""
    try:
        from rpm_lib.data import prepare_cache
    except ImportError as error:
        _say(f"skipping the 80 px cache: rpm_lib.data.prepare_cache is not available yet ({error})")
        return
    _say(f"building the 80 px cache {ctx.cache}")
    ctx.results["cache"] = prepare_cache(ctx.data, ctx.cache, size=80, workers=ctx.workers, kind="raven")


def _rule_lines(configuration: str, npz_meta_matrix, seed: int, index: int) -> list[str]:
    """Rules with parameters from the generator when available, else decoded from ``meta_matrix``."""
    try:
        from rpm_lib.generator.api import generate_problem, problem_rng
        from rpm_lib.viz import describe_problem_rules

        return describe_problem_rules(generate_problem(configuration, problem_rng(seed, configuration, index)))
    except ImportError:
        from rpm_lib.viz import describe_rules

        return describe_rules(npz_meta_matrix, configuration)


def step_gallery(ctx: DemoContext) -> None:
    """Save ``<out>/gallery.png``: problem 0 of every configuration with its answer and rules."""
    import numpy as np

    from rpm_lib.generator.writer import ALL_CONFIGURATIONS, problem_stem
    from rpm_lib.rules import SHORT_NAMES
    from rpm_lib.viz import GalleryItem, plot_gallery

    items = []
    for configuration in ALL_CONFIGURATIONS:
        path = problem_stem(ctx.data, configuration, 0).with_suffix(".npz")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run the 'generate' step first")
        with np.load(path, allow_pickle=False) as data:
            panels, target, meta_matrix = data["image"], int(data["target"]), data["meta_matrix"]
        items.append(GalleryItem(panels, target, f"{SHORT_NAMES[configuration]} ({configuration}, problem 0)",
                                 _rule_lines(configuration, meta_matrix, ctx.seed, 0)))
    figure = plot_gallery(items, ncols=2, title="I-RAVEN (balanced) - one problem per configuration; answer framed green")
    ctx.out.mkdir(parents=True, exist_ok=True)
    target_path = ctx.out / "gallery.png"
    temp = ctx.out / ".gallery.png.tmp"
    figure.savefig(temp, dpi=80, bbox_inches="tight", format="png")
    os.replace(temp, target_path)
    _say(f"gallery: {target_path}")
    ctx.results["gallery"] = target_path


#: The demo, in order. Append ``DemoStep(name, description, function)`` to extend it.
STEPS: list[DemoStep] = [
    DemoStep("generate", "generate a small balanced I-RAVEN set (all 7 configurations)", step_generate),
    DemoStep("cache", "build its 80 px memory-mapped cache", step_cache),
    DemoStep("gallery", "save gallery.png: one RPM per configuration with rules in words", step_gallery),
]


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rpm_lib.demo", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="run folder for figures (default: runs/demo)")
    parser.add_argument("--data", default="data/demo-iraven", help="generated data folder (default: data/demo-iraven)")
    parser.add_argument("--cache", default=None, help="80 px cache folder (default: <data>-80)")
    parser.add_argument("--num-per-config", type=int, default=60, help="problems per configuration (default: 60)")
    parser.add_argument("--seed", type=int, default=1234, help="generator seed (default: 1234)")
    parser.add_argument("--workers", type=int, default=1, help="processes for generation / caching (default: 1)")
    parser.add_argument("--steps", default="all", help="comma-separated step names to run (default: all)")
    parser.add_argument("--list-steps", action="store_true", help="print the steps and exit")
    return parser


def run_steps(ctx: DemoContext, names: Sequence[str] | None = None) -> None:
    """Run the named steps (all when None) in ``STEPS`` order, timing each."""
    known = [step.name for step in STEPS]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown demo step(s) {unknown}; known: {known}")
    for step in STEPS:
        if names is not None and step.name not in names:
            continue
        began = time.perf_counter()
        _say(f"step {step.name}: {step.description}")
        step.run(ctx)
        _say(f"step {step.name} done in {time.perf_counter() - began:.1f} s")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_steps:
        for step in STEPS:
            print(f"{step.name:12s} {step.description}")
        return 0
    if args.num_per_config < 1:
        print("demo: --num-per-config must be >= 1", file=sys.stderr)
        return 2
    data = Path(args.data)
    ctx = DemoContext(
        out=Path(args.out),
        data=data,
        cache=Path(args.cache) if args.cache else data.with_name(data.name + "-80"),
        num_per_config=args.num_per_config,
        seed=args.seed,
        workers=args.workers,
    )
    names = None if args.steps == "all" else [s.strip() for s in args.steps.split(",") if s.strip()]
    try:
        run_steps(ctx, names)
    except (RuntimeError, ValueError, FileNotFoundError) as error:
        print(f"demo: error: {error}", file=sys.stderr)
        return 1
    _say("finished: " + ", ".join(f"{k}={v}" for k, v in ctx.results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
