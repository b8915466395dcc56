"""Host time of Lightning's ``self.log`` bookkeeping during validation: rpm_lib's validation (device-side sums, one
``self.log`` per term at the epoch's end) beside the per-batch logging it replaced (one ``self.log`` per term and
batch), in one process, alternating rounds.

    python experiments/gpu-profile/bench_validation_logging.py [--rounds 3] [--num-per-config 60]

Generates a small balanced I-RAVEN in a temporary folder (or reads ``--data-root``) and validates WReN at 32 px,
batch 2, one thread, on the CPU: what is measured is the host's time inside ``self.log``, which does not depend
on the device (on a GPU bound by kernel launches it is time the GPU waits).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from rpm_lib.training.config import TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.generation import ensure_generated
from rpm_lib.training.module import RpmModule
from rpm_lib.training.plans import stage_plan


class PerBatchLogging(RpmModule):
    """The validation logging rpm_lib had before 2026-11-27: every term of every batch through ``self.log``."""

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        _to_backward, value, parts = self.stage_losses(batch)
        size = int(batch["target"].shape[0])
        self.log("val/loss", value, on_step=False, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        for name, term in parts.items():
            self.log(f"val/{name}", term, on_step=False, on_epoch=True, batch_size=size, sync_dist=True,
                     prog_bar=name == "accuracy")

    def on_validation_epoch_end(self) -> None:
        pass


def measure(cls: type[RpmModule], config: TrainConfig) -> dict[str, float]:
    """One validation pass (after a warm-up pass): ``self.log`` calls, their host ms per batch, the pass's ms per
    batch and the logged metrics."""
    plan = stage_plan(config)[0]
    torch.manual_seed(0)
    module = cls(config, config.rule_spec.width)
    module.set_stage(plan)
    spent = {"seconds": 0.0, "calls": 0}
    log = module.log

    def timed_log(*args: Any, **kwargs: Any) -> None:
        began = time.perf_counter()
        log(*args, **kwargs)
        spent["seconds"] += time.perf_counter() - began
        spent["calls"] += 1

    module.log = timed_log  # type: ignore[method-assign]
    datamodule = RpmDataModule(config, plan)
    datamodule.setup()
    loader = datamodule.val_dataloader()
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, dataloaders=loader, verbose=False)
    spent.update(seconds=0.0, calls=0)
    began = time.perf_counter()
    metrics = trainer.validate(module, dataloaders=loader, verbose=False)[0]
    wall = time.perf_counter() - began
    return {"batches": len(loader), "log_calls": spent["calls"], "log_ms_per_batch": 1000 * spent["seconds"] / len(loader),
            "ms_per_batch": 1000 * wall / len(loader), **{k: float(v) for k, v in metrics.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--num-per-config", type=int, default=60, help="problems per configuration (default 60)")
    parser.add_argument("--data-root", default=None, help="an I-RAVEN folder or cache (default: generate one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data_root or str(Path(tmp) / "iraven")
        config = TrainConfig(data_root=root, generate=args.data_root is None,
                             generate_num_per_config=args.num_per_config, generate_seed=3, image_size=32,
                             batch_size=2, encoder="wren", setup="ce_aux_sparse", accelerator="cpu",
                             progress_bar=False, num_workers=0)
        ensure_generated(config)
        results: dict[str, list[dict[str, float]]] = {"per batch (before)": [], "per epoch (now)": []}
        for _ in range(args.rounds):
            results["per batch (before)"].append(measure(PerBatchLogging, config))
            results["per epoch (now)"].append(measure(RpmModule, config))
    print("| validation logging | self.log calls per pass | host ms in self.log per batch | ms per batch |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        print(f"| {name} | {rows[0]['log_calls']} | {statistics.median(r['log_ms_per_batch'] for r in rows):.3f} "
              f"| {statistics.median(r['ms_per_batch'] for r in rows):.2f} |")
    before, now = results["per batch (before)"][0], results["per epoch (now)"][0]
    same = all(abs(before[k] - now[k]) <= 1e-5 * max(1.0, abs(before[k])) for k in before if k.startswith("val/"))
    print(f"\n{before['batches']} batches per pass, median of {args.rounds} rounds; logged metrics equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
