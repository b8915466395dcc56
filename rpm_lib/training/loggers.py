"""The experiment logger of a run (``TrainConfig.logger``), besides ``history.csv``, which every run writes.

``csv`` (default): ``history.csv`` only (Lightning's own logger is off). ``tensorboard``: also Lightning's
``TensorBoardLogger``, one TensorBoard run per stage in ``<run_dir>/tensorboard/<stage>/`` (each stage restarts its
step count, so stages must not share one). It holds what the module logs: ``train/epoch_loss`` (history.csv's
``train_loss``), ``val/loss``, ``val/accuracy``, the per-term losses of the stage (``train/<term>``,
``val/<term>``: ``answer``, ``aux``, ``mlcl``), ``train/accuracy``, the learning rate (``lr-Adam``) and, with
``progress_bar`` on, the step loss ``train/loss`` every ``log_every_n_steps`` steps. Watch every run of a batch with ``tensorboard --logdir runs/``.

The event files are logs, not run state: a resumed stage appends a new event file in the same folder, ``overwrite``
deletes the folder with the rest of the run, and ``rpm-batch pack`` leaves them behind (``history.csv``, which
travels, holds the epoch curves).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpm_lib.training.config import ConfigError

if TYPE_CHECKING:
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.setups import StagePlan

#: The run folder's subfolder of the TensorBoard logs (one folder per stage below it).
TENSORBOARD_DIR = "tensorboard"


def check_logger(config: "TrainConfig") -> None:
    """Refuse a logger whose package is missing, before anything is trained.

    Raises:
        ConfigError: one line naming the field and the install command.
    """
    if config.logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("config field 'logger': tensorboard needs the tensorboard package: "
                          "pip install 'rpm_lib[tensorboard]' (or logger=csv)")


def stage_loggers(config: "TrainConfig", plan: "StagePlan") -> tuple[Any, list[Any]]:
    """``(logger, callbacks)`` for one stage's Trainer: ``(False, [])`` for ``csv``; for ``tensorboard`` its
    ``TensorBoardLogger`` and a ``LearningRateMonitor`` (the lr column of history.csv)."""
    if config.logger != "tensorboard":
        return False, []
    check_logger(config)
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=str(Path(config.run_dir)), name=TENSORBOARD_DIR, version=plan.name,
                               default_hp_metric=False)
    return logger, [LearningRateMonitor(logging_interval="epoch")]
