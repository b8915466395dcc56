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
    .rpm-train.lock      held while a process trains here: a second one is refused (rpm_lib.run_progress.RUN_LOCK)

Resume: with ``resume=true`` finished stages are skipped (their weights reloaded) and the interrupted
stage continues from its ``last.ckpt`` (weights, optimiser, early stopping, epoch counter, position in the
epoch). Because all randomness is a function of (seed, stage, epoch, index, step), the final metrics on CPU
equal those of an uninterrupted run.

Time-boxed runs: with ``time_budget=SECONDS`` a run stops at a step boundary before the budget ends
(``rpm_lib.training.time_budget``), writes ``progress.json`` with ``"status": "unfinished"`` and returns
``{"status": "unfinished", ...}`` (``rpm-train`` exits with ``rpm_lib.run_progress.UNFINISHED_EXIT_CODE``, 75); ``resume=true``
continues it, on this machine or another (``rpm-batch pack`` / ``unpack``). ``progress.json`` records the
fingerprint of the training data (``rpm_lib.data.fingerprint``) when the run starts; a resumed run refuses data
with another fingerprint. Paths in progress.json are relative and Lightning's are re-rooted, so a folder can move.
"""
from __future__ import annotations

import atexit
import contextlib
import csv
import dataclasses
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from rpm_lib.training.callbacks import FiniteLossGuard, HistoryCallback, StepLimit, quiet_lightning
from rpm_lib.training.distributed import release_process_group
from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO
from rpm_lib.checkpoints import load_plain
from rpm_lib.json_files import read_object
from rpm_lib.run_folder import FINISHED, RUN_LOCK, UNFINISHED, recorded_weights, weights_record
from rpm_lib.training.stop_signals import KeepStopSignals, stop_on_signals
from rpm_lib.training.time_budget import STOP_FILE, Deadline, TimeBudgetReached, TimeBudgetStop, stage_start_seconds
from rpm_lib.training.history import history_rows
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.loggers import TENSORBOARD_DIR, check_logger, stage_loggers
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.generation import ensure_generated
from rpm_lib.training.eval_sets import (EvalSet, check_extra_sets, extra_sets, main_sets, read_regime,
                                        set_entry)
from rpm_lib.training.evaluation import answer_summary, predict
from rpm_lib.training.module import RpmModule, float32_matmul_precision
from rpm_lib.data.seeding import derive_seed
from rpm_lib.training.setups import SETUPS, StagePlan, protocol_of, stage_plan, within_total_epochs

# Every rank of a DDP run destroys its gloo group before the interpreter's finalisation; left to it, 1 in ~25 CPU runs
# of tests/training/test_training_ddp.py aborted at exit after writing its files (release_process_group says why).
atexit.register(release_process_group)

#: Files and folders of a run that ``overwrite`` deletes and ``resume`` continues.
RUN_ARTIFACTS: tuple[str, ...] = ("checkpoints", "progress.json", "history.csv", "metrics.json", "predictions.npz",
                                  TENSORBOARD_DIR)
#: The per-set prediction files of extra test sets (``predictions_<name>.npz``), also deleted by ``overwrite``.
EXTRA_PREDICTIONS_GLOB = "predictions_*.npz"

#: Fields that may change between an interrupted run and its resumption (everything else must match).
#: ``data_root`` may move (another machine): the data's fingerprint, not its path, says whether it is the same.
RESUMABLE_CHANGES: frozenset[str] = frozenset({
    "resume", "overwrite", "progress_bar", "num_workers", "log_every_n_steps", "save_predictions", "accelerator",
    "devices", "num_nodes", "strategy", "max_epochs", "linear_eval_epochs", "finetune_epochs", "max_steps",
    "patience", "min_delta", "limit_test_batches", "generate_workers", "test_data_roots", "time_budget", "compile",
    "compile_scope", "compile_mode", "fused_adam", "logger",
    "data_root", "run_dir", "data_check",
})


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
    # Fail before touching the run folder.
    resolve_precision(config)
    check_logger(config)
    if _launch_rank() == 0:
        for note in config.unused_settings():
            print(f"rpm-train: note: {note}", file=sys.stderr)
    if not config.generate and not Path(config.data_root).exists():
        raise ConfigError(f"config field 'data_root': {config.data_root} does not exist (set generate=true to create "
                          "a small I-RAVEN there, or point it at a dataset / cache)")
    if Path(config.data_root).exists():
        read_regime(config.data_root)  # a broken regime.json fails now, not after training
    check_extra_sets(config)
    began = time.perf_counter()
    run_dir = Path(config.run_dir)
    rank = _launch_rank()
    with quiet_lightning(), float32_matmul_precision(config.matmul_precision), contextlib.ExitStack() as signals:
        if rank == 0:
            _lock_run_dir(run_dir, signals)  # before _prepare_run_dir: overwrite=true deletes files
            _prepare_run_dir(config, run_dir)
            stop_file = run_dir / STOP_FILE
            if stop_file.is_dir() and not stop_file.is_symlink():
                raise ConfigError(f"{stop_file} is a folder; remove it (a file of that name asks a run to stop)")
            stop_file.unlink(missing_ok=True)  # a request that an earlier call already obeyed
        # After the unlink: a signal from now on is a request for this call.
        signals.enter_context(stop_on_signals(run_dir / STOP_FILE, interactive=stop_on_terminal_signals))
        plans = stage_plan(config)
        torch.manual_seed(derive_seed(config.seed, "init"))
        module = RpmModule(config, config.rule_spec.width)
        progress = _read_progress(run_dir / "progress.json") if config.resume else {}
        if config.resume and rank == 0:
            _check_history(run_dir / "history.csv")
        finished = _finished_metrics(run_dir, progress, config) if rank == 0 else None
        if finished is not None:
            return finished  # its config.yaml stays the one its results came from
        if rank == 0:
            # Stored without the run-control flags, so `rpm-train --config <run_dir>/config.yaml` re-runs it as is.
            dataclasses.replace(config, resume=False, overwrite=False, time_budget=None).to_yaml(
                run_dir / "config.yaml")
        stages: dict[str, Any] = dict(progress.get("stages", {}))
        record = ProgressRecord(run_dir, progress, rank == 0, config.data_check, call)
        trainer: L.Trainer | None = None
        datamodule: RpmDataModule | None = None
        for index, full_plan in enumerate(plans):
            # max_total_epochs: a stage gets what the earlier stages left; one left nothing does not run.
            epochs_done = sum(int(stages.get(p.name, {}).get("epochs", 0)) for p in plans[:index])
            plan = within_total_epochs(full_plan, epochs_done, config)
            if plan is None:
                stages[full_plan.name] = {"name": full_plan.name, "completed": True, "skipped": True, "epochs": 0,
                                          "global_step": 0}
                continue
            module.set_stage(plan)
            datamodule = RpmDataModule(config, plan, fingerprint=record.check_data)
            done = stages.get(plan.name)
            if done and done.get("skipped"):
                raise ConfigError(f"resume: {run_dir}/progress.json says stage {plan.name} was skipped, but the "
                                  "epochs of the stages before it leave it some; use overwrite=true")
            if done and done.get("completed"):
                _load_weights(module, _inside_run_dir(run_dir, done.get("weights")))
                continue
            last = run_dir / "checkpoints" / plan.name / "last.ckpt"
            if done and done.get("global_step") and not last.is_file() and rank == 0:
                print(f"rpm-train: note: {last} is missing, so stage {plan.name} starts again at step 0 "
                      f"({run_dir / 'progress.json'} recorded step {done['global_step']})", file=sys.stderr)
            try:
                trainer, stages[plan.name] = _run_stage(config, plan, module, datamodule, run_dir, callbacks,
                                                         deadline)
            except TimeBudgetReached as stop:
                step = stop.global_step if stop.global_step is not None else int((done or {}).get("global_step", 0))
                stages[plan.name] = {"name": plan.name, "completed": False, "global_step": step}
                return record.unfinished(config, plan.name, stages, began, deadline.stop_requested(),
                                         deadline.first_step_s)
            if trainer.is_global_zero:
                record.write(stages)
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
        metrics = _evaluate(config, module, datamodule, trainer, run_dir,
                            [p.name for p in plans if not stages[p.name].get("skipped")])
        metrics["stages"] = [stages[p.name] for p in plans]
        metrics.update(_provenance(config, time.perf_counter() - began))
        metrics["status"] = FINISHED
        _write_json(run_dir / "metrics.json", metrics)
        record.finish(stages, began, deadline.first_step_s)
        return metrics


def _finished_metrics(run_dir: Path, progress: dict[str, Any], config: TrainConfig) -> dict[str, Any] | None:
    """The stored metrics of a finished run resumed with the same test sets (nothing left to do), else None.

    A finished run's archive (``rpm-batch pack``) carries no weights, so it must not be evaluated again; with
    other ``test_data_roots`` it is (and then needs its weights).
    """
    if progress.get("status") != FINISHED or not (run_dir / "metrics.json").is_file():
        return None
    metrics = _read_json(run_dir / "metrics.json")
    if metrics.get("config", {}).get("test_data_roots") != config.test_data_roots:
        return None
    ignored = [f"{name} {metrics['config'][name]!r} -> {getattr(config, name)!r}" for name in FINISHED_RUN_IGNORES
               if name in metrics.get("config", {}) and metrics["config"][name] != getattr(config, name)]
    if ignored:
        print(f"rpm-train: note: {run_dir} is finished, so {'; '.join(ignored)} changes nothing: its results stay "
              "those of metrics.json (train in another run_dir, or overwrite=true, to use them)", file=sys.stderr)
    return metrics


#: Resumable fields that would change how much a run trains: set on a finished run, they change nothing (a note).
FINISHED_RUN_IGNORES = ("max_epochs", "linear_eval_epochs", "finetune_epochs", "max_steps", "patience", "min_delta")


class ProgressRecord:
    """``progress.json`` of a run: finished stages, the run's status, its time slices, the data fingerprint.

    Layout::

        {"status": "finished" | "unfinished",
         "stages": {name: summary},           # summary["completed"] is false for a stage a budget cut short
         "data_fingerprint": "sha256-pieces-v1:...",   # every array file, pixels included
         "data_problems": "sha256-problems-v1:...",    # a cache's arrays but its pixels (absent for raw files)
         "data_opencv": {"rendered": "5.0.0", "resized": "5.0.0"},
         "data_changes": [...],                        # pixel changes accepted with data_check=problems
         "slices": [{"seconds": s, "ended_in": stage | "evaluation" | "end", "global_step": n,
                     "called_at": t, "process_s": s,  # when the call began (time.time()); its process's age then
                     "first_step_s": s}, ...]}       # first_step_s: only for a call that trained a step

    Args:
        run_dir: the run folder.
        progress: the file's content when resuming (``{}`` for a new run).
        writer: whether this process writes files (rank 0).
        data_check: ``exact`` or ``problems`` (:class:`TrainConfig`'s field).
        call: ``called_at`` and ``process_s`` of this training call, recorded in each of its slices.
    """

    def __init__(self, run_dir: Path, progress: dict[str, Any], writer: bool, data_check: str = "exact",
                 call: dict[str, float | None] | None = None) -> None:
        self.run_dir = run_dir
        self.progress = progress
        self.writer = writer
        self.data_check = data_check
        self.call = {k: v for k, v in (call or {}).items() if v is not None}  # called_at, process_s
        self._fingerprint: str | None = None  # computed once per process: every stage's data module asks

    @property
    def path(self) -> Path:
        return self.run_dir / "progress.json"

    def check_data(self, root: str | Path) -> str:
        """Fingerprint ``root``; record it for a new run, or refuse data that differ from the recorded one.

        Beside ``data_fingerprint`` (every pixel) a run records ``data_problems`` (a cache's arrays but its pixels,
        :func:`rpm_lib.data.fingerprint.problems_fingerprint`) and ``data_opencv`` (what drew and resized the
        pixels, :mod:`rpm_lib.data.opencv_version`); a run that began before these existed gets them at the next
        check its data pass. When only the pixels differ, the refusal says so and names both OpenCV versions;
        ``data_check="problems"`` then continues, appending the change to ``data_changes``.

        Raises:
            ConfigError: naming the folder, both fingerprints and what to do.
        """
        import rpm_lib.data.opencv_version as opencv_version
        from rpm_lib.data.fingerprint import data_fingerprint, problems_fingerprint

        if self._fingerprint is not None:
            return self._fingerprint
        current = data_fingerprint(root)
        recorded = self.progress.get("data_fingerprint")
        problems = problems_fingerprint(root)
        made = opencv_version.recorded(root)
        if recorded is not None and recorded != current:
            then = self.progress.get("data_opencv")
            same_problems = problems is not None and problems == self.progress.get("data_problems")
            versions = (f"pixels here {opencv_version.describe(made)}, when the run started "
                        f"{opencv_version.describe(then)}")
            # The same recorded versions cannot explain other pixels: another CPU's code path or an edited cache can.
            same_versions = bool(made) and made == then
            cause = ("the same OpenCV versions made both, so something else changed the pixels: another build or "
                     "CPU, or an edited cache" if same_versions else "OpenCV versions draw some edge pixels differently")
            if not same_problems:
                raise ConfigError(
                    f"resume: the data in {root} are not the data this run started on (fingerprint {current[-12:]}, "
                    f"recorded {recorded[-12:]} in {self.path}; {versions}); regenerate them with the run's generator "
                    "settings (seed, count, regime, image size) or start a new run")
            if self.data_check != "problems":
                raise ConfigError(
                    f"resume: the data in {root} hold the problems this run started on, but other pixels "
                    f"(fingerprint {current[-12:]}, recorded {recorded[-12:]} in {self.path}; {versions}: {cause}); "
                    "make them as the run's were, or pass data_check=problems to continue on these pixels")
            if self.writer:  # once per run, not once per DDP rank
                print(f"rpm-train: note: continuing on other pixels of the same problems in {root} ({versions}"
                      f"{'; ' + cause if same_versions else ''}); recorded in {self.path} under data_changes",
                      file=sys.stderr)
            self.progress.setdefault("data_changes", []).append(
                {"slice": len(self.progress.get("slices", [])) + 1, "data_fingerprint": current,
                 "previous_fingerprint": recorded, "data_opencv": made, "previous_opencv": then,
                 "accepted_by": "data_check=problems"})
        self.progress["data_fingerprint"] = self._fingerprint = current
        if problems is not None:
            self.progress["data_problems"] = problems
        self.progress["data_opencv"] = made
        if recorded is None and self.writer:
            # Written now, not when the first stage ends: a run killed before that (SIGKILL, the out-of-memory
            # killer, a lost node) resumes from its last.ckpt, and without the record it would accept any data.
            _write_json(self.path, self.progress)
        return current

    def has_time_for_evaluation(self, deadline: Deadline, config: TrainConfig) -> bool:
        """Whether the final evaluation (val, test, extra test sets) is predicted to end before the deadline.

        Predicted from the last stage's measured validation time (its summary's ``val_seconds``).
        """
        if not deadline.active:
            return True
        summaries = [s for s in self.progress.get("stages", {}).values() if s.get("val_seconds")]
        if not summaries:
            return deadline.allows(stage_start_seconds(deadline))
        last = summaries[-1]
        # val + test (the same size under the 60/20/20 split) + each extra test set; a validation pass also
        # computed losses, so this overestimates a little, which is the safe side.
        sets = 2 + len(config.test_data_roots or [])
        return deadline.allows(sets * float(last["val_seconds"]) + 1.0)

    def write(self, stages: dict[str, Any], status: str | None = None) -> None:
        self.progress["stages"] = stages
        if status is not None:
            self.progress["status"] = status
        if self.writer:
            _write_json(self.path, self.progress)

    def _slice(self, ended_in: str, stages: dict[str, Any], began: float, first_step_s: float | None) -> None:
        steps = {name: summary.get("global_step") for name, summary in stages.items()}
        entry = {"seconds": round(time.perf_counter() - began, 3), "ended_in": ended_in, "global_step": steps,
                 **self.call}
        if first_step_s is not None:
            # what this call spent before training (data check, checkpoint, loaders, CUDA), its first step included
            entry["first_step_s"] = first_step_s
        self.progress.setdefault("slices", []).append(entry)

    def unfinished(self, config: TrainConfig, stage: str, stages: dict[str, Any], began: float,
                   stop_requested: bool = False, first_step_s: float | None = None) -> dict[str, Any]:
        """Record that the budget (or a stop request) ended this slice in ``stage``; return the unfinished result
        (``made_progress``: whether this call trained a step or finished a stage, for the unfinished line).
        ``first_step_s``: when this call's first training step ended (:attr:`Deadline.first_step_s`)."""
        def standing(slice_record: dict[str, Any]) -> Any:
            return slice_record.get("ended_in"), slice_record.get("global_step")

        previous = self.progress.get("slices") or []
        before = standing(previous[-1]) if previous else None
        self._slice(stage, stages, began, first_step_s)
        self.write(stages, UNFINISHED)
        made_progress = (standing(self.progress["slices"][-1]) != before if previous else
                         any(s.get("completed") or s.get("global_step") for s in stages.values()))
        return {"status": UNFINISHED, "stage": stage, "global_step": stages.get(stage, {}).get("global_step"),
                "run_dir": str(self.run_dir), "seconds": round(time.perf_counter() - began, 3),
                "time_budget": config.time_budget, "stop_requested": stop_requested, "made_progress": made_progress}

    def finish(self, stages: dict[str, Any], began: float, first_step_s: float | None = None) -> None:
        self._slice("end", stages, began, first_step_s)
        self.write(stages, FINISHED)


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
    history = HistoryCallback(Path(config.run_dir) / "history.csv", plan.name)
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
        enable_progress_bar=config.progress_bar,
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


def _run_stage(config: TrainConfig, plan: StagePlan, module: RpmModule, datamodule: RpmDataModule, run_dir: Path,
               callbacks: Sequence[L.Callback], deadline: Deadline | None = None) -> tuple[L.Trainer, dict[str, Any]]:
    """Fit one stage (resuming its ``last.ckpt`` when asked) and summarise it.

    Raises:
        TimeBudgetReached: ``deadline`` stopped the stage; its resumable ``last.ckpt`` is written.
    """
    stage_dir = run_dir / "checkpoints" / plan.name
    last = stage_dir / "last.ckpt"
    trainer, checkpoint, early_stopping = make_trainer(config, plan, stage_dir, callbacks, deadline)
    if config.resume and last.is_file():
        # a damaged or foreign file is one line here, not Lightning's traceback
        _check_fits(module, _load_checkpoint(last), last, resume_point_of=plan.name)
    began = time.perf_counter()
    # weights_only: a shared run folder's last.ckpt is untrusted input (never unpickle code from it).
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(last) if config.resume and last.is_file() else None,
                weights_only=True)
    if trainer.interrupted:
        raise RuntimeError(f"stage {plan.name} was interrupted; rerun with resume=true to continue")
    trainer.strategy.barrier("rpm_stage_end")
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    weights = best if (config.restore_best and best is not None and best.is_file()) else last
    if config.restore_best and weights.is_file():
        _load_weights(module, weights)
    score = checkpoint.best_model_score
    epochs, steps, stopped_epoch = int(trainer.current_epoch), int(trainer.global_step), early_stopping.stopped_epoch
    if steps == 0 and last.is_file():
        # ddp_spawn / ddp_notebook train in child processes; the state of this process's Trainer stays at zero.
        epochs, steps, score, stopped_epoch = _progress_from_checkpoint(last)
    summary = {
        "name": plan.name,
        "completed": True,
        "epochs": epochs,
        "global_step": steps,
        "best_val_loss": None if score is None else float(score),
        "best_val_accuracy": _best_epoch_accuracy(run_dir, plan.name),
        "stopped_early": bool(stopped_epoch > 0),
        "weights": weights_record(run_dir, weights),
        "lr": plan.lr,
        "batch_size": plan.batch_size,
        "wall_time_s": round(time.perf_counter() - began, 3),
    }
    budget = next((c for c in trainer.callbacks if isinstance(c, TimeBudgetStop)), None)  # type: ignore[attr-defined]
    if budget is not None and budget.validation_seconds is not None:
        summary["val_seconds"] = round(budget.validation_seconds, 3)
    return trainer, summary


def _best_epoch_accuracy(run_dir: Path, stage: str) -> float | None:
    """Validation accuracy (fraction) of ``stage``'s epoch with the lowest validation loss, from ``history.csv``.

    ``None`` when the stage has no answer accuracy (pre-training) or no history. With several stages that train
    the scoring head (linear evaluation, then fine-tuning) this keeps each stage's own result in ``metrics.json``.
    """
    rows = [r for r in history_rows(run_dir / "history.csv")
            if r.get("stage") == stage and r.get("val_loss") and r.get("val_accuracy")]
    if not rows:
        return None
    best = min(rows, key=lambda r: float(r["val_loss"]))
    return float(best["val_accuracy"])


def _progress_from_checkpoint(path: Path) -> tuple[int, int, float | None, int]:
    """(epochs run, global step, best val loss, early-stopping stopped_epoch) recorded in a Lightning checkpoint."""
    checkpoint = _load_checkpoint(path)
    score, stopped_epoch = None, 0
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and state.get("best_model_score") is not None:
            score = float(state["best_model_score"])
        if key.startswith("EarlyStopping"):
            stopped_epoch = int(state.get("stopped_epoch", 0))
    return int(checkpoint["epoch"]) + 1, int(checkpoint["global_step"]), score, stopped_epoch


def _inside_run_dir(run_dir: Path, weights: Any) -> Path:
    """The checkpoint a ``progress.json`` names, refused in one line unless it lies inside ``run_dir``."""
    if not isinstance(weights, str) or not weights:
        raise ConfigError(f"resume: {run_dir / 'progress.json'}: field 'weights' must be a checkpoint path "
                          f"inside the run folder, got {weights!r}")
    path = recorded_weights(run_dir, weights)
    if path is None:
        raise ConfigError(f"resume: {run_dir / 'progress.json'}: field 'weights' ({weights}) points outside the run "
                          "folder; refusing to load it")
    return path


def _load_checkpoint(path: Path) -> dict[str, Any]:
    """A Lightning checkpoint read with ``weights_only=True``: tensors and plain containers only, never code.

    Checkpoints come from run folders that people share; unpickling arbitrary objects would run their code.
    """
    return load_plain(path, ConfigError, "delete it (and the run's progress.json) or use overwrite=true")


def _load_weights(module: RpmModule, path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"resume: checkpoint {path} is missing; delete progress.json or use overwrite=true")
    checkpoint = _load_checkpoint(path)
    _check_fits(module, checkpoint, path)
    module.load_state_dict(checkpoint["state_dict"])


#: What Lightning reads from a checkpoint it resumes a stage from (``Trainer.fit(ckpt_path=...)``).
RESUME_POINT_KEYS = ("epoch", "global_step", "pytorch-lightning_version", "loops", "optimizer_states")


def _check_fits(module: RpmModule, checkpoint: dict[str, Any], path: Path, resume_point_of: str | None = None) -> None:
    """One line unless ``checkpoint`` holds exactly ``module``'s weights (names and shapes), and, for the resume
    point of stage ``resume_point_of``, what Lightning resumes from, written by that stage.

    Raises:
        ConfigError: ``resume: checkpoint <path> does not fit this run (...)``.
    """
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"resume: checkpoint {path} does not fit this run ({why}); delete it (and the run's "
                           "progress.json) or use overwrite=true")

    expected = {name: tuple(value.shape) for name, value in module.state_dict().items()}
    found = {name: tuple(value.shape) if isinstance(value, torch.Tensor) else None
             for name, value in checkpoint["state_dict"].items()}
    missing, extra = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or extra:
        names = [f"{len(missing)} missing, e.g. {missing[0]}"] if missing else []
        names += [f"{len(extra)} unknown, e.g. {extra[0]}"] if extra else []
        raise refuse(f"weights: {'; '.join(names)}")
    wrong = next((name for name in expected if found[name] != expected[name]), None)
    if wrong is not None:
        raise refuse(f"weight {wrong} has shape {found[wrong]}, the model's is {expected[wrong]}")
    if resume_point_of is None:
        return
    absent = [key for key in RESUME_POINT_KEYS if key not in checkpoint]
    if absent:
        raise refuse(f"no {', '.join(absent)}: not a checkpoint that training resumes from")
    stage = checkpoint.get("rpm_stage")
    if stage is not None and stage != resume_point_of:
        raise refuse(f"it was written by stage {stage}, not {resume_point_of}")


# ----------------------------------------------------------------------------------------------
# evaluation and provenance
# ----------------------------------------------------------------------------------------------
def _eval_device(config: TrainConfig, trainer: L.Trainer | None) -> torch.device:
    if config.trains_on_cuda:
        if trainer is not None and trainer.strategy.root_device.type == "cuda":
            return trainer.strategy.root_device
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _evaluate(config: TrainConfig, module: RpmModule, datamodule: RpmDataModule, trainer: L.Trainer | None,
              run_dir: Path, stages_run: list[str]) -> dict[str, Any]:
    """Final metrics: the flat val / test keys (unchanged) and ``test_sets``, one entry per evaluated set; the
    ``protocol`` (``rpm_lib.training.setups.PROTOCOLS``) says what the final weights measure."""
    device = _eval_device(config, trainer)
    precision = resolve_precision(config)
    protocol = protocol_of(config, stages_run)
    # A fine-tuned run is not the paper's linear evaluation: its label says so (Table 1 rows stay linear-eval).
    label = SETUPS[config.setup].label + ("+FT" if protocol == "fine_tuned" else "")
    metrics: dict[str, Any] = {"setup": config.setup, "setup_label": label, "protocol": protocol,
                               "encoder": config.encoder, "dataset": config.dataset}
    # Read after training: with generate=true the data (and its regime.json) exist only from the first stage on.
    trained = read_regime(config.data_root)
    entries = []
    for eval_set in [*main_sets(config), *extra_sets(config)]:
        summary = _evaluate_set(config, module, datamodule, eval_set, device, precision, run_dir)
        if eval_set.main:  # the flat keys of earlier versions: val_accuracy, test_accuracy_per_configuration, ...
            metrics.update({f"{eval_set.split}_{key}": value for key, value in summary.items()})
        evaluated = trained if eval_set.main else read_regime(eval_set.data_root, field="test_data_roots")
        entries.append(set_entry(eval_set, summary, trained, evaluated))
    metrics["test_sets"] = entries
    # Predictions of test sets this evaluation no longer lists (an earlier test_data_roots) would read as current.
    current = {eval_set.predictions_file for eval_set in [*main_sets(config), *extra_sets(config)]}
    for stale in run_dir.glob(EXTRA_PREDICTIONS_GLOB):
        if stale.name not in current:
            stale.unlink()
    return metrics


def _evaluate_set(config: TrainConfig, module: RpmModule, datamodule: RpmDataModule, eval_set: EvalSet,
                  device: torch.device, precision: str, run_dir: Path) -> dict[str, Any]:
    """Predict one set with the final weights, save its predictions (test splits), return its summary."""
    limit = config.limit_val_batches if eval_set.split == "val" else config.limit_test_batches
    loader = datamodule.eval_dataloader(eval_set.split, root=None if eval_set.main else eval_set.data_root)
    desc = f"evaluate {eval_set.split}" if eval_set.main else f"evaluate {eval_set.name} (test)"
    predictions = predict(module, loader, device, precision, limit, progress=config.progress_bar, desc=desc)
    if eval_set.split == "test" and config.save_predictions:
        predictions.save(run_dir / eval_set.predictions_file)
    return answer_summary(predictions, config)


def _provenance(config: TrainConfig, seconds: float) -> dict[str, Any]:
    import lightning

    import rpm_lib

    versions = {"rpm_lib": rpm_lib.__version__, "python": platform.python_version(), "torch": torch.__version__,
                "lightning": lightning.__version__, "numpy": np.__version__}
    for name in ("albumentations", "cv2", "scipy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    return {
        "config": config.to_dict(),
        "seed": config.seed,
        "git_commit": _git_commit(),
        "versions": versions,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        "runtime_s": round(seconds, 3),
    }


def _git_commit() -> str | None:
    """HEAD of the repository holding rpm_lib (with ``-dirty`` when there are local changes), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
        return commit.stdout.strip() + ("-dirty" if status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------------------------
# run folder
# ----------------------------------------------------------------------------------------------
def _launch_rank() -> int:
    """Global rank known from the launcher's environment before any Trainer exists (0 when not launched)."""
    for name in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(name, "").isdigit():
            if name == "SLURM_PROCID" and int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
                continue
            return int(os.environ[name])
    # Lightning's own subprocess launcher marks its children with LOCAL_RANK / NODE_RANK.
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = int(os.environ.get("NODE_RANK", "0") or 0)
    return 0 if local == 0 and node == 0 else max(1, local)


def _prepare_run_dir(config: TrainConfig, run_dir: Path) -> None:
    """Refuse, clear or check a run folder's earlier run; the folder itself was made by :func:`_lock_run_dir`."""
    present = [name for name in RUN_ARTIFACTS if (run_dir / name).exists()]
    present += sorted(p.name for p in run_dir.glob(EXTRA_PREDICTIONS_GLOB))
    if config.resume and present and not (run_dir / "config.yaml").is_file():
        # Without it nothing below can tell that this config (seed, lr, batch_size, ...) is the run's: the rest
        # of the run would silently train with other settings, and metrics.json record only the new ones.
        raise ConfigError(f"resume: {run_dir} holds a run ({', '.join(present)}) but no config.yaml, so nothing "
                          "shows that this config is the one it started with; put its config.yaml back, or use "
                          "overwrite=true")
    if present and not config.resume:
        if not config.overwrite:
            raise ConfigError(
                f"config field 'run_dir': {run_dir} already holds a run ({', '.join(present)}); set resume=true "
                "to continue it or overwrite=true to replace it"
            )
        for name in present:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    if config.resume and (run_dir / "config.yaml").is_file():
        previous = TrainConfig.from_yaml(run_dir / "config.yaml").to_dict()
        current = config.to_dict()
        changed = sorted(k for k in current if k not in RESUMABLE_CHANGES and previous.get(k) != current[k])
        if changed:
            raise ConfigError(
                f"resume: {run_dir}/config.yaml differs in {', '.join(changed)}; resuming would mix two runs "
                "(use another run_dir or overwrite=true)"
            )
        moved = previous.get("data_root") != current["data_root"]
        if moved and "data_fingerprint" not in _read_json(run_dir / "progress.json"):
            # Only a recorded fingerprint can tell that data in another folder are the same data.
            raise ConfigError(f"resume: {run_dir}/progress.json records no data fingerprint, so data_root cannot "
                              f"move ({previous.get('data_root')} -> {current['data_root']}); resume with the "
                              "original data_root")


def _lock_run_dir(run_dir: Path, stack: contextlib.ExitStack) -> None:
    """Hold ``run_dir``'s write lock until ``stack`` closes: a second process on the same run folder (a batch
    started twice, a resume beside a running slice) is refused in one line instead of writing ``last.ckpt``,
    ``history.csv`` and ``progress.json`` over the first one's, or deleting them (``overwrite=true``).

    A file system without ``flock`` (some network mounts) gets a note and no lock.

    Raises:
        ConfigError: ``run_dir`` is a file or cannot be made, another process holds the lock, or something other
            than a regular file sits at the lock's path.
    """
    import errno

    from rpm_lib.folder_lock import FolderBusyError, UnsafeLockFileError, exclusive_writer

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"config field 'run_dir': {run_dir} is a file, not a folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"config field 'run_dir': cannot make the folder {run_dir} ({error.strerror})") from None
    try:
        stack.enter_context(exclusive_writer(run_dir / RUN_LOCK, "rpm-train", folder=run_dir))
    except (FolderBusyError, UnsafeLockFileError) as error:
        raise ConfigError(f"config field 'run_dir': {error}") from None
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        print(f"rpm-train: note: {run_dir}: the file system offers no lock ({error.strerror}); make sure no other "
              "process trains in this run folder", file=sys.stderr)


def _read_json(path: Path) -> dict[str, Any]:
    return read_object(path, ConfigError, "delete it or use overwrite=true", missing_ok=True)


def _read_progress(path: Path) -> dict[str, Any]:
    """``progress.json`` (``{}`` when absent), every field a resumed run reads checked for its type (see
    :class:`ProgressRecord` for the layout).

    A shared or hand-edited file is untrusted: ``"slices": "abc"`` or a number as ``data_fingerprint`` failed with a
    traceback after the whole slice had trained, ``"epochs": "x"`` before the second stage.

    Raises:
        ConfigError: ``<path>: field '<name>' must be ...; delete it or use overwrite=true``.
    """
    progress = _read_json(path)

    def refuse(field: str, what: str) -> ConfigError:
        return ConfigError(f"{path}: field {field!r} must be {what}; delete it or use overwrite=true")

    stages = progress.get("stages", {})
    if not isinstance(stages, dict) or not all(isinstance(s, dict) for s in stages.values()):
        raise refuse("stages", "a mapping of stage names to objects")
    for name, summary in stages.items():
        for key in ("epochs", "global_step"):
            value = summary.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise refuse(f"stages.{name}.{key}", f"a whole number >= 0, got {value!r}")
        for key in ("completed", "skipped"):
            if key in summary and not isinstance(summary[key], bool):
                raise refuse(f"stages.{name}.{key}", f"true or false, got {summary[key]!r}")
    if progress.get("status") not in (None, FINISHED, UNFINISHED):
        raise refuse("status", f"{FINISHED!r} or {UNFINISHED!r}, got {progress['status']!r}")
    for field in ("slices", "data_changes"):
        value = progress.get(field, [])
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise refuse(field, "a list of objects")
    for field in ("data_fingerprint", "data_problems"):
        if not isinstance(progress.get(field, ""), str):
            raise refuse(field, f"a fingerprint string, got {progress[field]!r}")
    if not isinstance(progress.get("data_opencv") or {}, dict):
        raise refuse("data_opencv", f"an object, got {progress['data_opencv']!r}")
    return progress


def _check_history(path: Path) -> None:
    """Refuse, in one line, a ``history.csv`` that a resumed stage cannot read back (it keeps the rows before the
    resume point): text that is not UTF-8 CSV, no ``stage`` or ``epoch`` column, an epoch that is no whole number.

    Checked before training: the stage read it only when it started, with a traceback.

    Raises:
        ConfigError: naming the file and the line.
    """
    advice = "fix that line or delete the file (the run then resumes without the rows before), or use overwrite=true"
    try:
        rows = history_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"resume: {path}: unreadable ({type(error).__name__}: {error}); delete it (the run then "
                          "resumes without the rows before) or use overwrite=true") from None
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        epoch = row.get("epoch")
        if row.get("stage") is None or epoch is None:
            raise ConfigError(f"resume: {path}: line {number}: no 'stage' and 'epoch' columns; {advice}")
        if not (epoch.strip().isascii() and epoch.strip().isdigit()):
            raise ConfigError(f"resume: {path}: line {number}: epoch {epoch!r} is not a whole number >= 0; {advice}")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    # Strict JSON: NaN (e.g. the AP of a rule with no positives) becomes null.
    tmp.write_text(json.dumps(finite_for_json(data), indent=2, sort_keys=False, default=_json_default, allow_nan=False))
    tmp.replace(path)


def finite_for_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) in nested dicts / lists replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_for_json(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
