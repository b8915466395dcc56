"""How long does SCL sit on the ln 8 plateau under cross-entropy?

SCL trained with CE starts with all eight answer scores nearly equal, so the loss is ln 8 = 2.0794 and
accuracy is at chance. This bench counts the optimiser steps until the running training loss (mean of
the last 10 steps) first falls below ln 8 - 0.05, for many seeds, with exactly the pieces ``rpm-train``
uses (``TrainConfig``, ``RpmModule``, ``RpmDataModule``, its seeded sampler and answer shuffling, the
per-step reseeding, Adam from ``configure_optimizers``). The loop replaces only Lightning's loop, which
adds nothing to a 32-bit CPU step without clipping or accumulation.

    python experiments/release-comparison/bench_plateau.py                       # CE, batch 16 and 32, seeds 0-9, default config
    python experiments/release-comparison/bench_plateau.py --set input_norm=none # the same with a config field changed
    python experiments/release-comparison/bench_plateau.py --diagnose --seeds 0  # per-layer statistics along one run

Data: ``data/demo-iraven-48`` (``make demo`` builds it; or ``--data``), 48 px like the demo.
Target (issue #9): median <= 50 steps and worst seed <= 150 steps at batch 16 and at batch 32.
Not a test: it trains 20 short runs (several minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[2]
LN8 = math.log(8.0)


def _config(data: str, batch_size: int, seed: int, overrides: dict):
    from rpm_lib.training.config import TrainConfig

    fields = {"data_root": data, "image_size": 48, "encoder": "scl", "setup": "ce", "batch_size": batch_size,
              "seed": seed, "accelerator": "cpu", "precision": "32-true", "num_workers": 0, "progress_bar": False,
              "run_dir": "/tmp/bench-plateau-unused"}
    fields.update(overrides)
    return TrainConfig(**fields)


def steps_to_escape(config, max_steps: int, margin: float = 0.05, window: int = 10,
                    on_step=None) -> tuple[int | None, list[float]]:
    """Train ``config``'s first stage until the running loss (mean of ``window`` steps) < ln 8 - ``margin``.

    Returns:
        (the 1-based step at which that first happened or ``None`` within ``max_steps``, the per-step losses).
    """
    import torch

    from rpm_lib.training.datamodule import RpmDataModule
    from rpm_lib.training.module import RpmModule
    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.training.plans import stage_plan
    from rpm_lib.training.setups import STAGES

    plan = stage_plan(config)[0]
    torch.manual_seed(derive_seed(config.seed, "init"))
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(plan)
    data = RpmDataModule(config, plan)
    data.setup("fit")
    loader = data.train_dataloader()
    optimizer = module.make_optimizer()
    module.train()
    losses: list[float] = []
    step, epoch = 0, 0
    while step < max_steps:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            # RpmModule.on_train_batch_start's reseeding, with this loop's step as the global step.
            torch.manual_seed(derive_seed(config.seed, "global_rng", STAGES.index(plan.name), step, 0))
            loss, value, _parts = module.stage_losses(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if on_step is not None:
                on_step(step, module, batch)
            optimizer.step()
            losses.append(float(value))
            step += 1
            if len(losses) >= window and statistics.fmean(losses[-window:]) < LN8 - margin:
                return step, losses
            if step >= max_steps:
                break
        epoch += 1
    return None, losses


def diagnose(config, max_steps: int, every: int) -> None:
    """Print, every ``every`` steps: loss, spread of the 8 scores, per-module gradient norms and output std."""
    import torch

    def report(step, module, batch):
        if step % every:
            return
        with torch.no_grad():
            out = module(batch["panels"])
            scores = out["scores"]
            emb = out["embeddings"]
        spread = (scores.std(dim=1)).mean().item()
        emb_spread = (emb.std(dim=1).mean() / (emb.std() + 1e-12)).item()
        grads = {name: p.grad.norm().item() for name, p in module.named_parameters() if p.grad is not None}
        top = ", ".join(f"{k.replace('encoder.', '')}={v:.1e}" for k, v in list(grads.items())[::3][:8])
        print(f"step {step:4d}: score std over the 8 = {spread:.2e}; embedding spread across candidates / overall = "
              f"{emb_spread:.2e}; grad norms: {top}", flush=True)

    step, losses = steps_to_escape(config, max_steps, on_step=report)
    print(f"escaped at step {step}; loss at steps 1/50/100/last: "
          + ", ".join(f"{losses[i]:.3f}" for i in (0, min(49, len(losses) - 1), min(99, len(losses) - 1), -1)))


def _parse_set(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--data", default=str(REPO / "data" / "demo-iraven-48"), help="48 px cache (make demo builds it)")
    parser.add_argument("--batch-sizes", default="16,32", help="comma-separated (default 16,32)")
    parser.add_argument("--seeds", default="0-9", help="'0-9' or '0,3,5' (default 0-9)")
    parser.add_argument("--max-steps", type=int, default=400, help="give up after this many steps (counted as >max)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="TrainConfig field override, e.g. --set input_norm=none (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, so two benches can share 2 cores)")
    parser.add_argument("--diagnose", action="store_true", help="print per-step statistics of one run instead")
    parser.add_argument("--every", type=int, default=25, help="--diagnose: report every k steps")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if not Path(args.data).is_dir():
        print(f"bench_plateau: {args.data} does not exist; run `make demo` (or its generate,cache steps) first",
              file=sys.stderr)
        return 2
    seeds = (list(range(int(args.seeds.split("-")[0]), int(args.seeds.split("-")[1]) + 1)) if "-" in args.seeds
             else [int(s) for s in args.seeds.split(",")])
    overrides = _parse_set(args.set)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.diagnose:
        diagnose(_config(args.data, sizes[0], seeds[0], overrides), args.max_steps, args.every)
        return 0
    label = " ".join(args.set) or "default config"
    print(f"# steps until the 10-step running CE loss < ln 8 - 0.05 ({label}; > {args.max_steps} = never)")
    for batch_size in sizes:
        results = []
        began = time.perf_counter()
        for seed in seeds:
            step, _losses = steps_to_escape(_config(args.data, batch_size, seed, overrides), args.max_steps)
            results.append(step if step is not None else args.max_steps + 1)
            print(f"batch {batch_size} seed {seed}: {step if step is not None else f'> {args.max_steps}'}", flush=True)
        never = sum(r > args.max_steps for r in results)
        median = statistics.median(results)
        median_text = f"> {args.max_steps}" if median > args.max_steps else f"{median:.0f}"
        print(f"| {label} | batch {batch_size} | median {median_text} | worst "
              f"{'> ' + str(args.max_steps) if never else max(results)} | never {never}/{len(results)} | "
              f"{(time.perf_counter() - began) / 60:.1f} min |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
