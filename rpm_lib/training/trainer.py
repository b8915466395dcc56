"""The Lightning ``Trainer`` of one stage (:func:`make_trainer`) and the precision it trains in.

Every stage gets checkpointing (``last.ckpt`` after every epoch, ``best.ckpt`` at the lowest validation loss, paths
that survive the run folder moving: :class:`RunCheckpoint`), early stopping on ``val/loss``, ``history.csv``, a
guard against non-finite losses, the step limit, the loggers, and, with an active deadline, the time-budget stop.
"""
from __future__ import annotations

import sys

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from rpm_lib.run_folder import HISTORY
from rpm_lib.training.callbacks import FiniteLossGuard, HistoryCallback, KeepStopSignals, StepLimit
from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.loggers import stage_loggers
from rpm_lib.training.setups import StagePlan
from rpm_lib.training.time_budget import Deadline, TimeBudgetStop


# ----------------------------------------------------------------------------------------------
# stages
# ----------------------------------------------------------------------------------------------
def resolve_precision(config: TrainConfig) -> str:
    """``precision`` with ``auto`` resolved: bf16-mixed (or 16-mixed) on CUDA, 32-true elsewhere."""
    on_cuda = config.trains_on_cuda
    if config.precision != "auto":
        if not on_cuda and config.precision in ("16-mixed", "16-true") and config.accelerator != "mps":
            raise ConfigError(f"config field 'precision': {config.precision} needs a CUDA GPU; use bf16-mixed or "
                              "32-true on CPU (or precision=auto)")
        return config.precision
    if on_cuda:
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "32-true"


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose state survives the run folder moving (another machine, an unpacked archive).

    Lightning stores absolute paths (``dirpath``, ``best_model_path``, ...) in every checkpoint and, when a
    resumed run's folder differs, forgets the best score: the resumed stage would then keep a worse "best".
    Paths recorded under the old folder are re-rooted under the current one before Lightning reads them.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old = state_dict.get("dirpath")
        if old and self.dirpath and old != self.dirpath:
            state_dict = _reroot(state_dict, str(old), str(self.dirpath))
        super().load_state_dict(state_dict)

    # Lightning 2.6 writes last.ckpt only in an epoch that also wrote best.ckpt. A run stopped (time budget, SLURM
    # signal, crash) after an epoch that did not improve the validation loss would then resume from an older
    # last.ckpt and redo every step since. These hooks write last.ckpt after every epoch, in whichever of the two
    # hooks Lightning saves in (the epoch end when validation runs once per epoch, as in every run here).
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._keep_last_current(trainer, at_train_epoch_end=False)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._keep_last_current(trainer, at_train_epoch_end=True)

    def _keep_last_current(self, trainer: L.Trainer, at_train_epoch_end: bool) -> None:
        # _should_skip_saving_checkpoint is also true when the parent hook has just saved at this step.
        if (self.save_last and self._should_save_on_train_epoch_end(trainer) == at_train_epoch_end
                and not self._should_skip_saving_checkpoint(trainer)):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def _reroot(value: Any, old: str, new: str) -> Any:
    """``value`` with every string path under ``old`` moved under ``new`` (dict keys included)."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old.rstrip("/") + "/") else value
    if isinstance(value, dict):
        return {_reroot(k, old, new): _reroot(v, old, new) for k, v in value.items()}
    return value


def progress_shown() -> bool:
    """Whether a progress bar has somewhere to draw: a terminal, or a notebook kernel's output. Lightning's bar
    redraws on every step whatever its stream is, which fills a SLURM or CI log with ``\r`` lines."""
    return sys.stdout.isatty() or "ipykernel" in sys.modules


def make_trainer(config: TrainConfig, plan: StagePlan, stage_dir: Path, callbacks: Sequence[L.Callback] = (),
                 deadline: Deadline | None = None) -> tuple[L.Trainer, ModelCheckpoint, EarlyStopping]:
    """The Trainer of one stage, with checkpointing (last + best), early stopping, history and, with an active
    ``deadline``, the time-budget stop (last in the list: it writes a checkpoint after the others' hooks)."""
    checkpoint = RunCheckpoint(
        dirpath=stage_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1, save_last=True,
        auto_insert_metric_name=False, enable_version_counter=False,
    )
    # rpm_lib.training.early_stopping replays this callback's rule from history.csv (rpm-batch progress, ETAs)
    early_stopping = EarlyStopping(monitor="val/loss", mode="min", patience=config.patience,
                                   min_delta=config.min_delta, check_finite=True)
    history = HistoryCallback(Path(config.run_dir) / HISTORY, plan.name)
    budget = ([TimeBudgetStop(deadline, plan.name, stage_dir / "last.ckpt", config.max_steps)]
              if deadline is not None and deadline.active else [])
    logger, logger_callbacks = stage_loggers(config, plan)
    trainer = L.Trainer(
        accelerator=config.accelerator,
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=config.strategy,
        precision=resolve_precision(config),  # type: ignore[arg-type]
        max_epochs=plan.max_epochs,
        limit_train_batches=config.limit_train_batches,
        limit_val_batches=config.limit_val_batches,
        num_sanity_val_steps=0,
        callbacks=[history, FiniteLossGuard(plan.name), StepLimit(config.max_steps), early_stopping, checkpoint,
                   *logger_callbacks, *callbacks, KeepStopSignals(), *budget],
        logger=logger,
        enable_progress_bar=config.progress_bar and progress_shown(),
        enable_model_summary=False,
        log_every_n_steps=config.log_every_n_steps,
        gradient_clip_val=config.gradient_clip_val,
        sync_batchnorm=config.sync_batchnorm,
        deterministic=config.deterministic,
        use_distributed_sampler=False,  # EpochSampler shards itself and keeps (seed, epoch) ordering
        default_root_dir=config.run_dir,
        plugins=[SameFolderCheckpointIO()],  # last.ckpt is never seen half-written (see checkpoint_io)
    )
    return trainer, checkpoint, early_stopping
