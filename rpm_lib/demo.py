"""``make demo``: an end-to-end tour of rpm_lib, as a list of named, idempotent steps.

    python -m rpm_lib.demo --out runs/demo [--data data/demo-iraven] [--num-per-config 500] [--seed 0]

Steps (``--list-steps``; run a subset with ``--steps generate,gallery``):

1. ``generate``: a balanced I-RAVEN set (all 7 configurations) with ``rpm-generate``'s writer;
   resumable, so a rerun reuses finished files.
2. ``cache``: its 80 px memory-mapped cache (``rpm_lib.data.prepare_cache``) and the smaller cache the
   demo trainings read (``--train-size``, 48 px: SCL at 80 px is too slow for a 15-minute CPU demo).
3. ``gallery``: ``<out>/gallery.png``, one RPM per configuration, correct answer framed, rules in words.
4. ``explore``: the dataset-exploration and augmentation notebooks (01, 02), executed by papermill.
5. ``train``: ``configs/demo.yaml`` through ``rpm-batch``: SCL with CE and MLCL+AUG then fine-tuned (notebook 03), each
   evaluated (04) and its rule predictions shown (05), then the results table (06).
6. ``index``: ``<out>/index.md`` and ``<out>/index.html`` listing everything produced, with the test
   accuracies and a binomial test against chance (1/8).

Every step reuses finished work, so an interrupted demo continues where it stopped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from rpm_lib.cli_parser import OneLineArgumentParser

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
        seed: training seed of both runs (weights, sample order, answer shuffling, augmentation).
        data_seed: generator seed of the demo data.
        workers: processes for generation and caching.
        train_size: panel side (px) of the demo trainings and of their cache.
        batch_config: the ``rpm-batch`` YAML of the ``train`` step.
        quick: smoke-test sizes (a few optimiser steps; numbers are meaningless) for the test suite.
        results: what steps produced (paths, counts), for later steps and the final summary.
    """

    out: Path
    data: Path
    cache: Path
    num_per_config: int = 500
    seed: int = 0
    data_seed: int = 1234
    workers: int = 1
    train_size: int = 48
    batch_config: Path = Path("configs/demo.yaml")
    quick: bool = False
    results: dict = field(default_factory=dict)

    @property
    def train_cache(self) -> Path:
        """Cache at the trainings' panel size, beside the raw data (``<data>-<train_size>``)."""
        return self.data.with_name(f"{self.data.name}-{self.train_size}")


@dataclass(frozen=True)
class DemoStep:
    """A named step: ``run(ctx)`` must be idempotent (reuse finished work on a rerun)."""

    name: str
    description: str
    run: Callable[[DemoContext], None]
    expect: str = ""  # how the step tells its duration (said when it starts)


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------------


def step_generate(ctx: DemoContext) -> None:
    """Generate ``num_per_config`` balanced problems per configuration into ``ctx.data`` (resumable)."""
    from rpm_lib.generator.writer import write_dataset

    _say(f"generating {ctx.num_per_config} I-RAVEN problems x 7 configurations into {ctx.data} "
         f"(seed {ctx.data_seed})")
    summary = write_dataset(ctx.data, "all", count=ctx.num_per_config, seed=ctx.data_seed, mode="balanced",
                            workers=ctx.workers, progress=True)
    _say(f"data: {summary['written']} written, {summary['skipped']} reused")
    ctx.results["data"] = ctx.data


def step_cache(ctx: DemoContext) -> None:
    """Build the 80 px cache of the generated set (and the training size's, when it differs)."""
    from rpm_lib.data import prepare_cache

    _say(f"building the 80 px cache {ctx.cache}")
    ctx.results["cache"] = prepare_cache(ctx.data, ctx.cache, size=80, workers=ctx.workers, kind="raven")
    if ctx.train_size != 80:
        _say(f"building the {ctx.train_size} px cache the demo trainings read: {ctx.train_cache}")
        ctx.results["train_cache"] = prepare_cache(ctx.data, ctx.train_cache, size=ctx.train_size,
                                                   workers=ctx.workers, kind="raven")


def _rule_lines(configuration: str, seed: int, index: int) -> list[str]:
    """Rules with their parameters, from regenerating problem ``index`` (the generator is deterministic)."""
    from rpm_lib.generator.api import generate_problem, problem_rng
    from rpm_lib.viz import describe_problem_rules

    return describe_problem_rules(generate_problem(configuration, problem_rng(seed, configuration, index)))


def step_gallery(ctx: DemoContext) -> None:
    """Save ``<out>/gallery.png``: problem 0 of every configuration with its answer and rules."""
    import numpy as np

    from rpm_lib.generator.writer import problem_stem
    from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES
    from rpm_lib.viz import GalleryItem, plot_gallery

    items = []
    for configuration in CONFIGURATIONS:
        path = problem_stem(ctx.data, configuration, 0).with_suffix(".npz")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run the 'generate' step first")
        with np.load(path, allow_pickle=False) as data:
            panels, target = data["image"], int(data["target"])
        items.append(GalleryItem(panels, target, f"{SHORT_NAMES[configuration]} ({configuration}, problem 0)",
                                 _rule_lines(configuration, ctx.data_seed, 0)))
    figure = plot_gallery(items, ncols=2, title="I-RAVEN (balanced) - one problem per configuration; answer framed green")
    ctx.out.mkdir(parents=True, exist_ok=True)
    target_path = ctx.out / "gallery.png"
    temp = ctx.out / ".gallery.png.tmp"
    figure.savefig(temp, dpi=80, bbox_inches="tight", format="png")
    os.replace(temp, target_path)
    _say(f"gallery: {target_path}")
    ctx.results["gallery"] = target_path


#: Exploration notebooks: (template, extra parameters). Data comes from the demo set, never a download.
EXPLORE_NOTEBOOKS: tuple[tuple[str, dict], ...] = (
    ("notebooks/01_explore_dataset.ipynb", {}),
    ("notebooks/02_augmentations.ipynb", {}),
)

#: Smoke-test overrides of the ``train`` step (``--quick``): the pipeline runs, the numbers mean nothing.
QUICK_TRAIN_OVERRIDES: dict = {"max_epochs": 1, "linear_eval_epochs": 1, "finetune_epochs": 1, "limit_train_batches": 2,
                               "limit_val_batches": 1, "batch_size": 4}


#: Largest executed notebook read back (its figures are inline PNGs: a few MB for the demo's).
NOTEBOOK_MAX_BYTES = 256 << 20


def _executed_ok(path: Path) -> bool:
    """True when ``path`` is an executed notebook with no error output (a finished earlier run); False for a missing,
    unreadable or malformed one (over :data:`NOTEBOOK_MAX_BYTES`, too deep, cells or outputs of other types), which
    is executed again."""
    from rpm_lib.json_files import read_object

    if not path.is_file():
        return False
    try:
        notebook = read_object(path, ValueError, max_bytes=NOTEBOOK_MAX_BYTES, fields={"cells": list})
    except (OSError, ValueError):
        return False
    cells = notebook.get("cells", [])
    if not all(isinstance(cell, dict) and isinstance(cell.get("outputs", []), list) for cell in cells):
        return False
    outputs = [output for cell in cells for output in cell.get("outputs", [])]
    return all(isinstance(output, dict) for output in outputs) and not any(
        output.get("output_type") == "error" for output in outputs)


def step_explore(ctx: DemoContext) -> None:
    """Execute the exploration notebooks (01, 02) on the demo data into ``<out>/explore/``."""
    from rpm_lib.notebook_execution import execute_notebook, kernel_log_of

    done = []
    for template, extra in EXPLORE_NOTEBOOKS:
        stem = Path(template).stem
        executed = ctx.out / "explore" / f"{stem}.ipynb"
        if _executed_ok(executed):
            _say(f"{stem}: reusing {executed}")
        else:
            _say(f"{stem}: executing with papermill")
            execute_notebook(template, executed, {"data_root": str(ctx.data), "interactive": False,
                                                  "output_dir": str(ctx.out / "explore" / stem), **extra},
                             kernel_stderr=kernel_log_of(executed))
        done.append(executed)
    ctx.results["explore"] = done


def step_train(ctx: DemoContext) -> None:
    """Run ``configs/demo.yaml`` with ``rpm-batch``: SCL x {CE, MLCL+AUG+FT}, evaluation, results table."""
    from rpm_lib.batch import run_batch

    overrides = {"data_root": str(ctx.train_cache), "image_size": ctx.train_size, "seed": ctx.seed}
    if ctx.quick:
        overrides.update(QUICK_TRAIN_OVERRIDES)
    batch_dir = ctx.out / "batch"
    _say(f"training (papermill batch {ctx.batch_config} -> {batch_dir}): a line per finished epoch of each run "
         "follows, with the time left; the first one says how long the training takes on this machine")
    results = run_batch(ctx.batch_config, jobs=1, out=batch_dir, overrides=overrides, prepare=False)
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise RuntimeError("demo trainings failed: "
                           + "; ".join(f"{r.spec.name} ({r.run_dir}/error.txt: {r.error})" for r in failed))
    ctx.results["batch"] = batch_dir


def _binomial_p_value(correct: int, trials: int, chance: float = 1 / 8) -> float:
    """One-sided p-value of ``correct`` or more successes in ``trials`` under chance."""
    from scipy.stats import binomtest

    return float(binomtest(correct, trials, chance, alternative="greater").pvalue)


def _relative(path: Path, root: Path) -> str:
    return os.path.relpath(path, root)


def _percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{100 * fraction:.1f}%"


def demo_summary(ctx: DemoContext) -> list[dict]:
    """Per training run of the batch: setup, test accuracy, test size, p-value vs chance, run folder.

    Raises:
        ValueError: a ``metrics.json`` that is not what training writes (one line naming the file and the field).
    """
    from rpm_lib.json_files import printable, read_object, shown_value

    rows = []
    for metrics_path in sorted((ctx.out / "batch").glob("*/*/metrics.json")):
        metrics = read_object(metrics_path, ValueError, fields=_METRICS_TYPES)
        n, fraction = metrics.get("test_num_samples"), metrics.get("test_accuracy")
        if n is None or n < 1:
            raise ValueError(f"{metrics_path}: field 'test_num_samples' must be a count >= 1, got {n}")
        if fraction is None or not 0 <= fraction <= 1:  # NaN too
            raise ValueError(f"{metrics_path}: field 'test_accuracy' must be a fraction in [0, 1], got {fraction}")
        per_configuration = metrics.get("test_accuracy_per_configuration_short", {})
        bad = next((value for value in per_configuration.values() if not _is_fraction(value)), None)
        if bad is not None:
            raise ValueError(f"{metrics_path}: field 'test_accuracy_per_configuration_short' must hold fractions in "
                             f"[0, 1], got {shown_value(bad, 40)}")
        stages = metrics.get("stages", [])
        bad = next((stage for stage in stages if not isinstance(stage, dict)), None)
        if bad is not None:
            raise ValueError(f"{metrics_path}: field 'stages' must hold objects, got {shown_value(bad, 40)}")
        linear = next((s for s in stages if s.get("name") == "linear"), {})
        linear_accuracy = linear.get("best_val_accuracy") if metrics.get("config", {}).get("finetune") else None
        if linear_accuracy is not None and not _is_fraction(linear_accuracy):
            raise ValueError(f"{metrics_path}: field 'stages' (linear): 'best_val_accuracy' must be a fraction in "
                             f"[0, 1], got {shown_value(linear_accuracy, 40)}")
        rows.append({
            "run": metrics_path.parent,
            # table cells: control characters (a line break would split a row) escaped, long text cut
            "setup": printable(metrics.get("setup_label", metrics.get("setup", "?"))),
            "encoder": printable(metrics.get("encoder", "?")),
            "accuracy": float(fraction),
            "n": n,
            "p_value": _binomial_p_value(round(fraction * n), n),
            "per_configuration": per_configuration,
            # The paper's protocol result of a contrastive run that is fine-tuned afterwards (None otherwise).
            "linear_val_accuracy": linear_accuracy,
        })
    return rows


#: The types of the ``metrics.json`` fields the summary reads, where present.
_METRICS_TYPES: dict[str, type | tuple[type, ...]] = {
    "test_num_samples": int, "test_accuracy": (int, float), "stages": list, "config": dict, "setup": str,
    "setup_label": str, "encoder": str, "test_accuracy_per_configuration_short": dict,
}


def _is_fraction(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def step_index(ctx: DemoContext) -> None:
    """Write ``<out>/index.md`` and ``<out>/index.html``: every produced file, grouped, with results."""
    import html

    from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES

    out = ctx.out
    rows = demo_summary(ctx)
    shorts = [SHORT_NAMES[c] for c in CONFIGURATIONS]
    md = ["# rpm_lib demo", "",
          f"Data: `{ctx.data}` ({ctx.num_per_config} generated balanced I-RAVEN problems per configuration, "
          f"seed {ctx.data_seed}); trainings read `{ctx.train_cache}` ({ctx.train_size} px), training seed "
          f"{ctx.seed}.", ""]
    if rows:
        md += ["## Test accuracy", "",
               "| run | encoder | setup | test acc | test problems | p vs chance (1/8) | linear-eval val acc | "
               + " | ".join(shorts) + " |",
               "|---|---|---|---|---|---|---|" + "---|" * len(shorts)]
        for row in rows:
            per = row["per_configuration"]
            md.append(f"| `{_relative(row['run'], out)}` | {row['encoder']} | {row['setup']} | "
                      f"{100 * row['accuracy']:.1f}% | {row['n']} | {row['p_value']:.1e} | "
                      f"{_percent(row['linear_val_accuracy'])} | "
                      + " | ".join(f"{100 * per[s]:.1f}" if s in per else "-" for s in shorts) + " |")
        md.append("")
    sections = [
        ("Gallery", sorted(out.glob("gallery.png"))),
        ("Exploration notebooks (01, 02) and their figures", sorted((out / "explore").rglob("*.*"))),
        ("Training runs (03 train, 04 evaluate, 05 rule predictions)",
         sorted(p for p in (out / "batch").rglob("*.*") if "checkpoints" not in p.parts and p.parent != out / "batch"
                and "report" not in p.relative_to(out / "batch").parts[:1])),
        ("Results table (06) and batch summary",
         sorted([p for p in (out / "batch").glob("*.*")] + list((out / "batch" / "report").rglob("*.*")))),
    ]
    html_parts = ["<!doctype html><meta charset='utf-8'><title>rpm_lib demo</title>",
                  "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}"
                  "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}</style>",
                  "<h1>rpm_lib demo</h1>"]
    if rows:
        html_parts.append("<h2>Test accuracy</h2><table><tr><th>run</th><th>setup</th><th>test acc</th>"
                          "<th>n</th><th>p vs 1/8</th></tr>")
        for row in rows:
            html_parts.append(f"<tr><td>{html.escape(_relative(row['run'], out))}</td><td>{html.escape(row['setup'])}</td>"
                              f"<td>{100 * row['accuracy']:.1f}%</td><td>{row['n']}</td><td>{row['p_value']:.1e}</td></tr>")
        html_parts.append("</table>")
    for title, paths in sections:
        paths = [p for p in paths if p.is_file() and not p.name.startswith(".")]
        if not paths:
            continue
        md += [f"## {title}", ""] + [f"- [`{_relative(p, out)}`]({_relative(p, out)})" for p in paths] + [""]
        html_parts.append(f"<h2>{html.escape(title)}</h2><ul>")
        for p in paths:
            rel = html.escape(_relative(p, out))
            html_parts.append(f"<li><a href='{rel}'>{rel}</a></li>")
        html_parts.append("</ul>")
        for p in paths:
            if p.suffix == ".png":
                rel = html.escape(_relative(p, out))
                html_parts.append(f"<figure><img src='{rel}' loading='lazy'><figcaption>{rel}</figcaption></figure>")
    (out / "index.md").write_text("\n".join(md))
    (out / "index.html").write_text("\n".join(html_parts))
    _say(f"index: {out / 'index.md'} and {out / 'index.html'}")
    for row in rows:
        _say(f"{row['encoder']} {row['setup']}: test accuracy {100 * row['accuracy']:.1f}% on {row['n']} problems "
             f"(chance 12.5%, p = {row['p_value']:.1e})")
    ctx.results["index"] = out / "index.md"


#: The demo, in order. Append ``DemoStep(name, description, function)`` to extend it.
_BAR = "its progress bar shows the rate and the time left"
STEPS: list[DemoStep] = [
    DemoStep("generate", "generate a small balanced I-RAVEN set (all 7 configurations)", step_generate, _BAR),
    DemoStep("cache", "build its 80 px memory-mapped cache (and the trainings' smaller one)", step_cache, _BAR),
    DemoStep("gallery", "save gallery.png: one RPM per configuration with rules in words", step_gallery),
    DemoStep("explore", "execute the exploration notebooks 01 and 02 with papermill", step_explore),
    DemoStep("train", "SCL with CE and MLCL+AUG+FT through rpm-batch (notebooks 03, 04, 05, 06)", step_train,
             "the longest step: its time left is measured from the first epoch and updated every epoch"),
    DemoStep("index", "write index.md / index.html listing everything produced", step_index),
]


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="python -m rpm_lib.demo", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="run folder for figures (default: runs/demo)")
    parser.add_argument("--data", default="data/demo-iraven", help="generated data folder (default: data/demo-iraven)")
    parser.add_argument("--cache", default=None, help="80 px cache folder (default: <data>-80)")
    parser.add_argument("--num-per-config", type=int, default=500, help="problems per configuration (default: 500)")
    parser.add_argument("--train-size", type=int, default=48, help="panel side in px of the demo trainings (default: 48)")
    parser.add_argument("--batch-config", default="configs/demo.yaml", help="rpm-batch YAML of the train step")
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes: a few optimiser steps (numbers meaningless)")
    parser.add_argument("--seed", type=int, default=0,
                        help="training seed of both runs (default: 0); runs are named after it (setup-ce__seed-0)")
    parser.add_argument("--data-seed", type=int, default=1234, help="generator seed of the demo data (default: 1234)")
    parser.add_argument("--workers", type=int, default=1, help="processes for generation / caching (default: 1)")
    parser.add_argument("--steps", default="all", help="comma-separated step names to run (default: all)")
    parser.add_argument("--list-steps", action="store_true", help="print the steps and exit")
    return parser


def run_steps(ctx: DemoContext, names: Sequence[str] | None = None) -> None:
    """Run the named steps (all when None; names from ``STEPS``, which ``main`` checks) in ``STEPS`` order, timing
    each."""
    from rpm_lib.runs.live import duration

    for step in STEPS:
        if names is not None and step.name not in names:
            continue
        began = time.perf_counter()
        _say(f"step {step.name}: {step.description}" + (f" ({step.expect})" if step.expect else ""))
        step.run(ctx)
        _say(f"step {step.name} done in {duration(time.perf_counter() - began)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_steps:
        for step in STEPS:
            print(f"{step.name:12s} {step.description}")
        return 0
    # checked before any work starts: each of these used to fail (or do nothing and say "finished") part-way
    for option, value, least in (("--num-per-config", args.num_per_config, 1), ("--workers", args.workers, 1),
                                 ("--train-size", args.train_size, 8), ("--seed", args.seed, 0),
                                 ("--data-seed", args.data_seed, 0)):
        if value < least:
            parser.error(f"argument {option}: {value} is below {least}")
    names = None if args.steps == "all" else [s.strip() for s in args.steps.split(",") if s.strip()]
    known = [step.name for step in STEPS]
    if names is not None and not names:
        parser.error(f"argument --steps: no step named (known: {', '.join(known)}; or all)")
    unknown = [name for name in names or () if name not in known]
    if unknown:
        parser.error(f"argument --steps: unknown step {', '.join(unknown)} (known: {', '.join(known)}; or all)")
    data = Path(args.data)
    ctx = DemoContext(
        out=Path(args.out),
        data=data,
        cache=Path(args.cache) if args.cache else data.with_name(data.name + "-80"),
        num_per_config=args.num_per_config,
        seed=args.seed,
        data_seed=args.data_seed,
        workers=args.workers,
        train_size=args.train_size,
        batch_config=Path(args.batch_config),
        quick=args.quick,
    )
    from rpm_lib.runs.live import duration

    began = time.perf_counter()
    try:
        run_steps(ctx, names)
    except (RuntimeError, ValueError, FileNotFoundError) as error:
        print(f"demo: error: {error}", file=sys.stderr)
        return 1
    _say("finished: " + ", ".join(f"{k}={v}" for k, v in ctx.results.items()))
    index = ctx.out / "index.html"
    if index.is_file():
        _say(f"done in {duration(time.perf_counter() - began)}; everything it made is listed in {index.resolve()} "
             f"(and {ctx.out / 'index.md'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
