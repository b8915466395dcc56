"""Does the MLCL term learn, or do the projections collapse to one point?

With every projection equal, each similarity is 1 / tau and the multi-label contrastive loss of every anchor
is exactly log(number of denominator terms) = log((M - 1) + M K) for M anchors and K = 7 wrong completions
each ("batch" negatives). This bench pre-trains MLCL(+AUG) with exactly the pieces ``rpm-train`` uses
(``TrainConfig``, ``RpmModule``, ``RpmDataModule`` with its augmentation and answer shuffling, the per-step
reseeding, Adam from ``configure_optimizers``) and prints, every ``--every`` steps, the mean and minimum
cosine similarity between correct completions' projections, between each correct completion and its own
wrong ones, the contrastive loss next to that collapse value, and the gradient norm reaching the projection
head.

    python experiments/release-comparison/bench_mlcl_collapse.py                          # MLCL+AUG, batch 32, seed 4, 60 steps
    python experiments/release-comparison/bench_mlcl_collapse.py --set beta=0.0           # contrastive term alone
    python experiments/release-comparison/bench_mlcl_collapse.py --set lr=0.0002 --steps 30

Data: ``data/demo-iraven-48`` (``make demo`` builds it; or ``--data`` with any data_root, raw or cache, and
``--image-size``). Steps may exceed one epoch: the loader is cycled epoch after epoch, each with its own
(seed, epoch) order and augmentation, as in training. Not a test (about a minute per 30 steps on 2 cores).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(REPO / "data" / "demo-iraven-48"),
                        help="data_root: an I-RAVEN folder or cache (default: the demo's 48 px cache)")
    parser.add_argument("--image-size", type=int, default=48, help="panel side in px (default 48)")
    parser.add_argument("--setup", default="mlcl_aug", choices=("mlcl", "mlcl_aug"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60, help="optimiser steps (default 60)")
    parser.add_argument("--every", type=int, default=10, help="print every N steps (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="config field override (YAML value), repeatable")
    return parser.parse_args(argv)


def endless_batches(loader: Any) -> Iterator[Any]:
    """The batches of ``loader`` epoch after epoch: epoch ``e`` sets the sampler's epoch to ``e`` first (when it
    has ``set_epoch``), so every epoch has its own order and augmentation. A plain ``iter(loader)`` ends (with
    StopIteration) after one epoch."""
    epoch = 0
    while True:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("bench_mlcl_collapse: the training loader yields no batch (too few problems for the batch "
                             "size?)")
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import yaml
    from torch.nn import functional as F

    from rpm_lib.losses import split_completions
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.datamodule import RpmDataModule
    from rpm_lib.training.module import RpmModule
    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.training.plans import stage_plan
    from rpm_lib.training.setups import STAGES

    if not Path(args.data).is_dir():
        print(f"error: {args.data} does not exist (run `make demo` or `python -m rpm_lib.demo --steps generate,cache`, "
              "or give --data)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    fields = {"data_root": args.data, "image_size": args.image_size, "encoder": "scl", "setup": args.setup,
              "batch_size": args.batch_size, "seed": args.seed, "accelerator": "cpu", "precision": "32-true",
              "num_workers": 0, "progress_bar": False, "run_dir": "/tmp/bench-mlcl-collapse-unused"}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --set expects FIELD=VALUE, got {item!r}", file=sys.stderr)
            return 2
        fields[key] = yaml.safe_load(value)
    config = TrainConfig(**fields)
    if config.gamma <= 0:
        print("error: gamma must be > 0 (without the contrastive term there is nothing to collapse)", file=sys.stderr)
        return 2
    plan = stage_plan(config)[0]
    torch.manual_seed(derive_seed(config.seed, "init"))
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(plan)
    module.train()
    datamodule = RpmDataModule(config, plan)
    datamodule.setup()
    optimizer = module.make_optimizer()
    loader = endless_batches(datamodule.train_dataloader())
    print(f"# {config.setup}, batch {config.batch_size}, seed {config.seed}, lr {config.lr}, beta {config.beta}, "
          f"gamma {config.gamma}, tau {config.temperature}, negatives {config.negatives}; command: "
          f"python experiments/release-comparison/bench_mlcl_collapse.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("| step | cos(correct, other correct) mean / min | cos(correct, own wrong) | MLCL loss | collapse value "
          "| aux loss | grad norm, projection head |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for step in range(args.steps + 1):
        batch = next(loader)
        torch.manual_seed(derive_seed(config.seed, "global_rng", STAGES.index(plan.name), step, 0))
        to_backward, _value, parts = module.stage_losses(batch)
        optimizer.zero_grad(set_to_none=True)
        to_backward.backward()
        if step % args.every == 0:
            with torch.no_grad():
                panels, target = batch["panels"], batch["target"]
                if panels.ndim == 5:
                    target = target.repeat_interleave(panels.shape[1])
                    panels = panels.flatten(0, 1)
                z, z_neg = split_completions(module.projection_head(module.embed(panels)), target)
                z, z_neg = F.normalize(z, dim=1), F.normalize(z_neg, dim=2)
                cos = z @ z.T
                others = cos[~torch.eye(len(cos), dtype=torch.bool)]
                own = torch.einsum("md,mkd->mk", z, z_neg).mean()
            num = z.shape[0]
            collapse = math.log((num - 1) + num * z_neg.shape[1]) if config.negatives == "batch" else float("nan")
            grad = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in module.projection_head.parameters()
                                 if p.grad is not None))
            aux = f"{float(parts['aux']):.4f}" if "aux" in parts else "–"
            print(f"| {step} | {float(others.mean()):.5f} / {float(others.min()):.5f} | {float(own):.5f} | "
                  f"{float(parts['mlcl']):.4f} | {collapse:.4f} | {aux} | {grad:.2e} |", flush=True)
        optimizer.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
