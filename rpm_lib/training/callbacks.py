"""Lightning callbacks of a run: ``history.csv``, quiet Lightning output, the stop signals kept through ``fit``."""
from __future__ import annotations

import csv
import logging
import math
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning as L

from rpm_lib.training.history import HISTORY_COLUMNS, history_rows
from rpm_lib.training.stop_signals import active_handlers


class HistoryCallback(L.Callback):
    """Appends ``stage, epoch, step, train_loss, val_loss, val_accuracy, lr`` to ``history.csv`` after
    every validation (rank 0 only).

    The file is the record: at the start of a (possibly resumed) stage, rows of this stage from epoch
    ``trainer.current_epoch`` on are dropped, so a resumed run's history equals an uninterrupted one's.
    ``val_accuracy`` is empty in stages without a trained scoring head (MLCL pre-training).
    """

    def __init__(self, path: str | Path, stage: str) -> None:
        self.path = Path(path)
        self.stage = stage
        self.rows: list[dict[str, Any]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        existing = history_rows(self.path)
        self.rows = [r for r in existing
                     if not (r["stage"] == self.stage and int(r["epoch"]) >= trainer.current_epoch)]
        if trainer.is_global_zero:
            self._write()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.rows.append({
            "stage": self.stage,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "train_loss": _number(pl_module.epoch_train_loss()),  # type: ignore[attr-defined]
            "val_loss": _number(metrics.get("val/loss")),
            "val_accuracy": _number(metrics.get("val/accuracy")),
            "lr": optimizer.param_groups[0]["lr"] if optimizer is not None else "",
        })
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=HISTORY_COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)


def _number(value: Any) -> float | str:
    if value is None:
        return ""
    number = float(value)
    return "" if math.isnan(number) else number


class NonFiniteLossError(RuntimeError):
    """A stage's training or validation loss became NaN or infinite; the run stops without results."""


class FiniteLossGuard(L.Callback):
    """Stop the run with :class:`NonFiniteLossError` when an epoch's training loss or its validation loss is
    not finite, so a diverged run never reaches evaluation and never writes metrics that look real.

    Checked once per validation (the epoch's mean loss is already on the host then), not per step: a check
    per step would make the CPU wait for the GPU every step.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        train_loss = pl_module.epoch_train_loss()  # type: ignore[attr-defined]
        val_loss = trainer.callback_metrics.get("val/loss")
        val_loss = float(val_loss) if val_loss is not None else float("nan")
        # NaN train loss before the first step (no steps yet) is not divergence.
        seen_steps = getattr(pl_module, "_epoch_loss_count", 0) > 0
        if (seen_steps and not math.isfinite(train_loss)) or not math.isfinite(val_loss):
            raise NonFiniteLossError(
                f"stage {self.stage}, epoch {trainer.current_epoch}: the loss is not finite (training {train_loss}, "
                f"validation {val_loss}); the run stops without results. Lower lr, set gradient_clip_val, or check "
                f"the data")


class StepLimit(L.Callback):
    """Stop a stage after ``max_steps`` optimiser steps, *with* a final validation.

    Lightning's own ``max_steps`` ends an epoch mid-way without validating, which leaves no val loss for
    early stopping and checkpointing; requesting a stop through ``trainer.should_stop`` validates first.
    """

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.max_steps > 0 and trainer.global_step >= self.max_steps:
            trainer.should_stop = True


class quiet_lightning:
    """Context manager: silence Lightning's INFO tips / device banners and known harmless warnings.

    Real warnings (e.g. about the data or the model) still come through.
    """

    _LOGGERS = ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
    _MESSAGES = (
        r".*does not have many workers.*",
        r".*isinstance\(treespec, LeafSpec\).*",
        r".*LeafSpec.*is deprecated.*",
        r".*The number of training batches .* is smaller than the logging interval.*",
        r".*Checkpoint directory .* exists and is not empty.*",
        r".*`training_step` returned `None`.*",
        r".*GPU available but not used.*",
        r".*srun. command is available on your system but is not used.*",
        r".*The `srun` command is available.*",
        r".*module\(s\) in eval mode at the start of training.*",  # frozen parts are kept in eval on purpose
        r".*It is recommended to use .self\.log\('train/.*sync_dist=True.*",  # training logs are per process
    )

    def __enter__(self) -> "quiet_lightning":
        self._levels = {name: logging.getLogger(name).level for name in self._LOGGERS}
        for name in self._LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        for message in self._MESSAGES:
            warnings.filterwarnings("ignore", message=message)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"lightning.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch.utils._pytree")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


class KeepStopSignals(L.Callback):
    """Re-installs :func:`rpm_lib.training.stop_signals.stop_on_signals`' handlers over the ones ``Trainer.fit``
    installed (Lightning's SIGTERM handler would end the run as if finished; see that module's docstring)."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in active_handlers().items():
                signal.signal(sig, handler)
