"""Learning benchmark on CPU: does an encoder (SCL by default) learn I-RAVEN with the CE, CE+AUX-sparse and MLCL+AUG
setups?

Generates a balanced I-RAVEN with the built-in generator, caches it at the benchmark's panel size, trains
SCL with each setup through ``rpm_lib.training.train`` (exactly what ``rpm-train`` runs), and prints a
Markdown table: test accuracy overall and per configuration, the number of test problems, a one-sided
binomial p-value against chance (1/8) and the wall time. Each setup must beat chance clearly (p < 1e-3
with >= 1,000 test problems in the full version).

    python bench/bench_learning.py            # full: 4-8 min per setup on 2 cores (~17 min for all 3)
    python bench/bench_learning.py --quick    # ~1 min smoke run (too few test problems for the p-value test)
    python bench/bench_learning.py --encoder predrnet   # another registered encoder (PredRNet: ~3x SCL's time)

Not a test: the numbers depend on the machine (and on its load: the 2-core machine is shared).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

REPO = Path(__file__).resolve().parents[1]

#: Chance level of an 8-choice problem.
CHANCE = 1.0 / 8.0
#: p-value a setup must reach (one-sided binomial test against chance) in the full benchmark.
ALPHA = 1e-3
SETUPS = ("ce", "ce_aux_sparse", "mlcl_aug")


@dataclasses.dataclass(frozen=True)
class Preset:
    """Sizes of one benchmark variant.

    Attributes:
        num_per_config: generated problems per configuration (60 / 20 / 20 % train / val / test).
        image_size: panel side in px (the cache is made at this size; 48 px keeps SCL's convolutions cheap).
        batch_size: RPMs per step.
        lr: Adam learning rate.
        supervised_epochs: epochs of ce / ce_aux_sparse.
        pretrain_epochs: epochs of MLCL+AUG pre-training (two views: about twice the cost of a CE epoch).
        linear_eval_epochs: epochs of MLCL's linear evaluation (frozen encoder: cheap).
        max_val_samples: validation problems used for early stopping and the val metrics.
    """

    num_per_config: int
    image_size: int
    batch_size: int
    lr: float
    supervised_epochs: int
    pretrain_epochs: int
    linear_eval_epochs: int
    max_val_samples: int | None


# Measured with this preset on the shared 2-core machine (load 0.1-2.5), seed 0, 1,050 test problems:
# CE 32.1 % (3.7 min), CE+AUX-sparse 35.8 % (5.0 min), MLCL+AUG 18.7 % (7.8 min; with 2 pre-training
# epochs instead of 4: 17.6 % in 4.6 min). Heavier load (3-5) made a CE epoch up to 3x slower.
PRESETS: dict[str, Preset] = {
    "full": Preset(num_per_config=750, image_size=48, batch_size=32, lr=0.002, supervised_epochs=4,
                   pretrain_epochs=4, linear_eval_epochs=3, max_val_samples=350),
    "quick": Preset(num_per_config=20, image_size=32, batch_size=16, lr=0.002, supervised_epochs=1,
                    pretrain_epochs=1, linear_eval_epochs=1, max_val_samples=28),
}


def binomial_p_value(successes: int, trials: int, p: float = CHANCE) -> float:
    """One-sided p-value of ``successes`` or more out of ``trials`` under Binomial(trials, p)."""
    from scipy.stats import binomtest

    return float(binomtest(successes, trials, p, alternative="greater").pvalue)


def prepare_data(data_dir: Path, preset: Preset, seed: int, workers: int) -> Path:
    """Generate (resumable) and cache the benchmark set; returns the cache folder."""
    from rpm_lib.data import prepare_cache
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.generation import ensure_generated

    raw = data_dir / f"iraven-{preset.num_per_config}-s{seed}"
    cache = data_dir / f"iraven-{preset.num_per_config}-s{seed}-{preset.image_size}px"
    began = time.perf_counter()
    ensure_generated(TrainConfig(data_root=str(raw), generate=True, generate_num_per_config=preset.num_per_config,
                                 generate_seed=seed, generate_workers=workers, progress_bar=False))
    prepare_cache(raw, cache, size=preset.image_size, workers=workers, show_progress=False)
    print(f"data: {raw} -> {cache} ready in {time.perf_counter() - began:.1f} s", flush=True)
    return cache


def run_setup(setup: str, cache: Path, out_dir: Path, preset: Preset, seed: int, progress: bool,
              encoder: str = "scl") -> dict[str, Any]:
    from rpm_lib.training import TrainConfig, train

    epochs = preset.pretrain_epochs if setup == "mlcl_aug" else preset.supervised_epochs
    config = TrainConfig(
        run_dir=str(out_dir / f"{encoder}-{setup}"), overwrite=True, seed=seed, data_root=str(cache),
        image_size=preset.image_size, setup=setup, encoder=encoder, batch_size=preset.batch_size, lr=preset.lr,
        max_epochs=epochs,
        linear_eval_epochs=preset.linear_eval_epochs, patience=epochs, max_val_samples=preset.max_val_samples,
        accelerator="cpu", devices=1, precision="32-true", num_workers=0, progress_bar=progress,
    )
    began = time.perf_counter()
    metrics = train(config)
    metrics["bench_wall_s"] = time.perf_counter() - began
    return metrics


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES

    shorts = [SHORT_NAMES[c] for c in CONFIGURATIONS]
    header = ["setup", "test acc", "n", "p vs 1/8", *shorts, "wall (min)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for setup, m in results.items():
        n = int(m["test_num_samples"])
        correct = round(m["test_accuracy"] * n)
        per = m["test_accuracy_per_configuration_short"]
        cells = [setup, f"{100 * m['test_accuracy']:.1f}%", str(n), f"{binomial_p_value(correct, n):.1e}",
                 *(f"{100 * per[s]:.1f}" if s in per else "-" for s in shorts), f"{m['bench_wall_s'] / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke version (tiny data, 1 epoch)")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated subset of {','.join(SETUPS)}")
    parser.add_argument("--seed", type=int, default=0, help="data and training seed")
    parser.add_argument("--encoder", default="scl", help="a registered encoder (rpm_lib.encoders.list_encoders())")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--data-dir", default=str(REPO / "data" / "bench"), help="where the generated set is kept")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench_learning"), help="run folders")
    parser.add_argument("--progress", action="store_true", help="show Lightning progress bars")
    for field in dataclasses.fields(Preset):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=float if field.name == "lr" else int,
                            default=None, help=f"override the preset's {field.name}")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    preset_name = "quick" if args.quick else "full"
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(Preset) if getattr(args, f.name) is not None}
    preset = dataclasses.replace(PRESETS[preset_name], **overrides)
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        parser.error(f"unknown setups {unknown}; choose from {', '.join(SETUPS)}")
    from rpm_lib.encoders import list_encoders

    if args.encoder not in list_encoders():
        parser.error(f"unknown encoder {args.encoder!r}; choose from {', '.join(list_encoders())}")
    print(f"preset {preset_name}: {preset}; torch threads {args.threads}", flush=True)

    cache = prepare_data(Path(args.data_dir), preset, args.seed, workers=max(1, args.threads))
    results: dict[str, dict[str, Any]] = {}
    for setup in setups:
        metrics = run_setup(setup, cache, Path(args.out) / preset_name, preset, args.seed, args.progress, args.encoder)
        results[setup] = metrics
        print(f"{setup}: test accuracy {100 * metrics['test_accuracy']:.1f}% on {metrics['test_num_samples']} "
              f"problems in {metrics['bench_wall_s'] / 60:.1f} min", flush=True)

    print()
    print(f"## {args.encoder} on generated I-RAVEN ({preset.num_per_config} problems / configuration, {preset.image_size} px, "
          f"batch {preset.batch_size}, lr {preset.lr}; {preset.supervised_epochs} epochs CE / CE+AUX, "
          f"{preset.pretrain_epochs} + {preset.linear_eval_epochs} linear-eval epochs MLCL+AUG), CPU, "
          f"{args.threads} threads")
    print()
    print(markdown_table(results))
    print()
    failing = [s for s, m in results.items()
               if binomial_p_value(round(m["test_accuracy"] * m["test_num_samples"]), int(m["test_num_samples"])) >= ALPHA]
    small = min(int(m["test_num_samples"]) for m in results.values())
    if args.quick:
        print("(quick smoke run: too few test problems and epochs for the chance test; run without --quick)")
    elif small < 1000:
        print(f"warning: only {small} test problems (< 1,000); raise --num-per-config")
    if not args.quick:
        print("all setups beat chance (p < 1e-3)" if not failing else f"NOT above chance (p >= 1e-3): {failing}")
    print()
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    return 0 if args.quick or not failing else 1


if __name__ == "__main__":
    sys.exit(main())
