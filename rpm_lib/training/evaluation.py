"""Final evaluation: per-sample predictions on a split, their metrics, and ``predictions.npz``.

This is a plain loop on one process (rank 0 under DDP), so the predictions cover every sample exactly
once (no DDP padding) and their order is the dataset order.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from rpm_lib.rules import SHORT_NAMES
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.metrics import accuracy, accuracy_by_group, rule_metrics


@dataclasses.dataclass
class Predictions:
    """Per-sample outputs on one split (N samples, dataset order).

    Attributes:
        index: int64 (N,) dataset index.
        target: int64 (N,) correct choice (after the split's fixed answer permutation).
        predicted: int64 (N,) argmax of ``scores``.
        configuration: int64 (N,) configuration (RAVEN) / regime (PGM) index.
        scores: float32 (N, 8) answer logits.
        source_id: str (N,) e.g. ``"center_single/RAVEN_8_test"``.
        rules: float32 (N, R) true rule vectors (configured encoding).
        rule_logits: float32 (N, R) rule-head logits, or ``None`` without a rule head.
    """

    index: np.ndarray
    target: np.ndarray
    predicted: np.ndarray
    configuration: np.ndarray
    scores: np.ndarray
    source_id: np.ndarray
    rules: np.ndarray
    rule_logits: np.ndarray | None

    def save(self, path: str | Path) -> None:
        """Write a compressed ``.npz`` with every attribute (``rule_logits`` only when present)."""
        arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        np.savez_compressed(path, **arrays)


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast Lightning would use for ``precision`` (mixed modes only)."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def batch_limit(limit: int | float, num_batches: int) -> int:
    """Lightning's ``limit_*_batches`` semantics: an int is a count, a float a fraction (at least 1 batch)."""
    if isinstance(limit, float):
        return num_batches if limit >= 1.0 else max(1, int(limit * num_batches))
    return min(int(limit), num_batches)


@torch.no_grad()
def predict(module: torch.nn.Module, loader: DataLoader, device: torch.device, precision: str = "32-true",
            limit_batches: int | float = 1.0, progress: bool = True, desc: str = "test") -> Predictions:
    """Run ``module`` (an :class:`~rpm_lib.training.module.RpmModule`) in eval mode over ``loader``."""
    from tqdm.auto import tqdm

    module.eval()
    module.to(device)
    total = batch_limit(limit_batches, len(loader))
    chunks: dict[str, list[Any]] = {k: [] for k in ("index", "target", "configuration", "scores", "source_id",
                                                   "rules", "rule_logits")}
    # disable=None: a bar on a terminal only (not redrawn into a log file or a SLURM output)
    bar = tqdm(total=total, desc=desc, unit="batch", disable=None if progress else True, leave=False)
    try:
        for number, batch in enumerate(loader):
            if number >= total:
                break
            with autocast_context(device, precision):
                out = module(batch["panels"].to(device, non_blocking=True))
            chunks["scores"].append(out["scores"].float().cpu())
            if "rule_logits" in out:
                chunks["rule_logits"].append(out["rule_logits"].float().cpu())
            for key in ("index", "target", "configuration", "rules"):
                chunks[key].append(torch.as_tensor(batch[key]).cpu())
            chunks["source_id"].extend(batch["source_id"])
            bar.update(1)
    finally:
        bar.close()
    if not chunks["scores"]:
        raise RuntimeError(f"{desc}: the loader yielded no batches")
    scores = torch.cat(chunks["scores"]).numpy().astype(np.float32)
    return Predictions(
        index=torch.cat(chunks["index"]).numpy().astype(np.int64),
        target=torch.cat(chunks["target"]).numpy().astype(np.int64),
        predicted=scores.argmax(axis=1).astype(np.int64),
        configuration=torch.cat(chunks["configuration"]).numpy().astype(np.int64),
        scores=scores,
        source_id=np.asarray(chunks["source_id"], dtype=str),
        rules=torch.cat(chunks["rules"]).numpy().astype(np.float32),
        rule_logits=torch.cat(chunks["rule_logits"]).numpy().astype(np.float32) if chunks["rule_logits"] else None,
    )


def answer_summary(predictions: Predictions, config: TrainConfig) -> dict[str, Any]:
    """Metrics of one evaluated set, unprefixed (accuracies are fractions in [0, 1]).

    Keys: ``accuracy``, ``loss`` (answer cross-entropy), ``num_samples``, and for I-RAVEN
    ``accuracy_per_configuration`` ``{folder name: fraction}``, ``accuracy_per_configuration_short``
    ``{Center: fraction, ...}`` and ``num_samples_per_configuration``; for PGM ``accuracy_per_regime``. With a rule
    head: ``rules`` (see :func:`rpm_lib.training.metrics.rule_metrics`).
    """
    from rpm_lib.training.samples import group_names

    p = predictions
    loss = F.cross_entropy(torch.from_numpy(p.scores), torch.from_numpy(p.target)).item()
    out: dict[str, Any] = {
        "accuracy": accuracy(p.predicted, p.target),
        "loss": loss,
        "num_samples": int(len(p.target)),
    }
    groups = accuracy_by_group(p.predicted, p.target, p.configuration, group_names(config))
    if config.dataset == "iraven":
        out["accuracy_per_configuration"] = {name: v["accuracy"] for name, v in groups.items()}
        out["accuracy_per_configuration_short"] = {SHORT_NAMES[name]: v["accuracy"] for name, v in groups.items()}
        out["num_samples_per_configuration"] = {name: v["num_samples"] for name, v in groups.items()}
    else:
        out["accuracy_per_regime"] = {name: v["accuracy"] for name, v in groups.items()}
    if p.rule_logits is not None:
        out["rules"] = rule_metrics(p.rule_logits, p.rules, config.rule_spec.slot_names())
    return out
