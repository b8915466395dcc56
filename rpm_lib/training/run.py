"""``train(config) -> metrics``: run every stage of a setup, evaluate, and write the run folder.

Run folder (``config.run_dir``)::

    config.yaml          the resolved TrainConfig (re-run it with `rpm-train --config config.yaml`)
    checkpoints/<stage>/ last.ckpt (every epoch) and best.ckpt (lowest val loss) of each stage
    progress.json        finished stages and their summaries (what `resume` skips)
    history.csv          stage, epoch, step, train_loss, val_loss, val_accuracy, lr
    metrics.json         final val / test metrics, per configuration, rule metrics, the protocol they measure
                         (linear evaluation, fine-tuned, ...: rpm_lib.training.setups.PROTOCOLS), config, seed, versions, and
                         test_sets: one entry per evaluated set (val, test, every test_data_roots folder) labelled
                         in- / out-of-distribution (rpm_lib.training.eval_sets)
    predictions.npz      per-sample test predictions (see rpm_lib.training.evaluation.Predictions)
    predictions_<name>.npz   the same for each extra test set
    final_weights.pt     the weights the test scored, bfloat16, with the config (rpm_lib.training.final_weights);
                         its SHA-256 is metrics.json's final_weights.sha256
    .rpm-train.lock      held while a process trains here: a second one is refused (rpm_lib.run_folder.RUN_LOCK)

Resume: with ``resume=true`` finished stages are skipped (their weights reloaded) and the interrupted
stage continues from its ``last.ckpt`` (weights, optimiser, early stopping, epoch counter, position in the
epoch). Because all randomness is a function of (seed, stage, epoch, index, step), the final metrics on CPU
equal those of an uninterrupted run.

Time-boxed runs: with ``time_budget=SECONDS`` a run stops at a step boundary before the budget ends
(``rpm_lib.training.time_budget``), writes ``progress.json`` with ``"status": "unfinished"`` and returns
``{"status": "unfinished", ...}`` (``rpm-train`` exits with ``rpm_lib.run_folder.UNFINISHED_EXIT_CODE``, 75); ``resume=true``
continues it, on this machine or another (``rpm-batch pack`` / ``unpack``). ``progress.json`` records the
fingerprint of the training data (``rpm_lib.data.fingerprint``) when the run starts; a resumed run refuses data
with another fingerprint. Paths in progress.json are relative and Lightning's are re-rooted, so a folder can move.

The pieces: ``run_dir`` (lock, overwrite, resume checks), ``progress_record`` (progress.json), ``plans`` (the
stages), ``fit`` (running them), ``trainer`` (a stage's Lightning Trainer), ``final_evaluation`` (metrics.json).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

from rpm_lib.data.seeding import derive_seed
from rpm_lib.run_folder import CONFIG, FINISHED, HISTORY, METRICS, PROGRESS, STOP_FILE
from rpm_lib.training.callbacks import quiet_lightning
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.distributed import release_process_group
from rpm_lib.training.eval_sets import check_extra_sets, read_regime
from rpm_lib.training.final_evaluation import evaluate_run, provenance
from rpm_lib.training.final_weights import write_final_weights
from rpm_lib.training.fit import train_stages
from rpm_lib.training.generation import ensure_generated
from rpm_lib.training.loggers import check_logger
from rpm_lib.training.module import RpmModule, float32_matmul_precision
from rpm_lib.training.plans import stage_plan
from rpm_lib.training.progress_record import ProgressRecord
from rpm_lib.training.run_dir import (check_history, finished_metrics, launch_rank, lock_run_dir, prepare_run_dir,
                                      read_progress, write_json)
from rpm_lib.training.stop_signals import stop_on_signals
from rpm_lib.training.time_budget import Deadline
from rpm_lib.training.trainer import resolve_precision

# Every rank of a DDP run destroys its gloo group before the interpreter's finalisation; left to it, 1 in ~25 CPU runs
# of tests/training/test_training_ddp.py aborted at exit after writing its files (release_process_group says why).
atexit.register(release_process_group)


def process_age_s() -> float | None:
    """Seconds this process has been running (from ``/proc``; None where there is none, as on macOS)."""
    try:
        # field 22 of /proc/self/stat, the start in clock ticks after boot; the name in field 2 may hold spaces
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return None


def as_config(config: TrainConfig | Mapping[str, Any] | str | Path) -> TrainConfig:
    """A TrainConfig from itself, a dict of fields, or a YAML path."""
    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, Mapping):
        return TrainConfig.from_dict(dict(config))
    if isinstance(config, (str, Path)):
        return TrainConfig.from_yaml(config)
    raise TypeError(f"train: expected a TrainConfig, a dict or a YAML path, got {type(config).__name__}")


def train(config: TrainConfig | Mapping[str, Any] | str | Path,
          callbacks: Sequence[L.Callback] = (), stop_on_terminal_signals: bool = False) -> dict[str, Any]:
    """Train and evaluate one run; returns the metrics written to ``<run_dir>/metrics.json``.

    Args:
        config: a :class:`TrainConfig`, a dict of its fields, or a YAML file.
        callbacks: extra Lightning callbacks added to every stage's Trainer.
        stop_on_terminal_signals: SIGTERM and Ctrl-C stop the run at its next step with a resumable state
            (``rpm-train``; a second Ctrl-C stops at once). Inside a SLURM job the scheduler's signals always do
            (``rpm_lib.training.stop_signals``).

    Returns:
        The metrics dict (on DDP ranks other than 0: ``{"rank": r}``; rank 0 writes the files), with
        ``"status": "finished"``; or, when ``time_budget`` ended the run first, ``{"status": "unfinished",
        "stage": ..., "global_step": ..., "run_dir": ...}`` and nothing but the resumable state written.

    Raises:
        ConfigError: invalid config, missing data, or a run folder that holds another run
            (use ``resume=true`` or ``overwrite=true``).
    """
    # where a slice's start-up goes: when this call began, and how long its process (a notebook kernel) had run
    call = {"called_at": round(time.time(), 3), "process_s": process_age_s()}
    config = as_config(config)
    deadline = Deadline(config.time_budget, stop_file=Path(config.run_dir) / STOP_FILE)
    _check_before_training(config)
    began = time.perf_counter()
    run_dir = Path(config.run_dir)
    rank = launch_rank()
    with quiet_lightning(), float32_matmul_precision(config.matmul_precision), contextlib.ExitStack() as signals:
        if rank == 0:
            lock_run_dir(run_dir, signals)  # before prepare_run_dir: overwrite=true deletes files
            prepare_run_dir(config, run_dir)
            _clear_stop_request(run_dir)
        # After the unlink: a signal from now on is a request for this call.
        signals.enter_context(stop_on_signals(run_dir / STOP_FILE, interactive=stop_on_terminal_signals))
        plans = stage_plan(config)
        torch.manual_seed(derive_seed(config.seed, "init"))
        module = RpmModule(config, config.rule_spec.width)
        progress = read_progress(run_dir / PROGRESS) if config.resume else {}
        if config.resume and rank == 0:
            check_history(run_dir / HISTORY)
        finished = finished_metrics(run_dir, progress, config) if rank == 0 else None
        if finished is not None:
            return finished  # its config.yaml stays the one its results came from
        if rank == 0:
            # Stored without the run-control flags, so `rpm-train --config <run_dir>/config.yaml` re-runs it as is.
            dataclasses.replace(config, resume=False, overwrite=False, restart_stage=False,
                                time_budget=None).to_yaml(run_dir / CONFIG)
        stages: dict[str, Any] = dict(progress.get("stages", {}))
        record = ProgressRecord(run_dir, progress, rank == 0, config.data_check, call)
        trainer, datamodule, unfinished = train_stages(config, plans, module, stages, record, callbacks, deadline,
                                                       began)
        if unfinished is not None:
            return unfinished
        if trainer is not None:
            rank = trainer.global_rank
        if rank != 0:
            return {"rank": rank}
        assert datamodule is not None
        if trainer is None:  # every stage finished in an earlier slice: the data may not be here yet
            ensure_generated(config)
            record.check_data(config.data_root)
        if not record.has_time_for_evaluation(deadline, config):
            return record.unfinished(config, "evaluation", stages, began, deadline.stop_requested(),
                                     deadline.first_step_s)
        metrics = evaluate_run(config, module, datamodule, trainer, run_dir,
                               [p.name for p in plans if not stages[p.name].get("skipped")])
        metrics["stages"] = [stages[p.name] for p in plans]
        metrics["final_weights"] = write_final_weights(module, config, run_dir)
        metrics.update(provenance(config, time.perf_counter() - began))
        metrics["status"] = FINISHED
        write_json(run_dir / METRICS, metrics)
        record.finish(stages, began, deadline.first_step_s)
        return metrics


def _check_before_training(config: TrainConfig) -> None:
    """What can fail before the run folder is touched: precision, logger, data folders, extra test sets."""
    resolve_precision(config)
    check_logger(config)
    if launch_rank() == 0:
        for note in config.unused_settings():
            print(f"rpm-train: note: {note}", file=sys.stderr)
    if not config.generate and not Path(config.data_root).exists():
        raise ConfigError(f"config field 'data_root': {config.data_root} does not exist (set generate=true to create "
                          "a small I-RAVEN there, or point it at a dataset / cache)")
    if Path(config.data_root).exists():
        read_regime(config.data_root)  # a broken regime.json fails now, not after training
    check_extra_sets(config)


def _clear_stop_request(run_dir: Path) -> None:
    """Remove a stop request that an earlier call already obeyed (a folder of that name is refused)."""
    stop_file = run_dir / STOP_FILE
    if stop_file.is_dir() and not stop_file.is_symlink():
        raise ConfigError(f"{stop_file} is a folder; remove it (a file of that name asks a run to stop)")
    stop_file.unlink(missing_ok=True)
