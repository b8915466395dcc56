"""Fitting the stages of a run (:func:`train_stages`, :func:`run_stage`) and the checkpoints they resume or reload.

A stage fits its ``Trainer`` (from its ``last.ckpt`` when resuming), reloads its best weights (``restore_best``)
and is summarised for ``progress.json``. Checkpoints come from run folders that people share: they are read with
``weights_only`` (never code) and must hold exactly the model's weights, and a resume point what Lightning resumes
from (:func:`check_fits`), or the run stops in one line. A stage whose steps ``progress.json`` records is never
started again at step 0 without being asked (:func:`resume_point`, ``restart_stage``).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

from rpm_lib.checkpoints import load_plain
from rpm_lib.run_folder import CHECKPOINTS, HISTORY, PROGRESS, weights_record
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.history import history_rows
from rpm_lib.training.module import RpmModule
from rpm_lib.training.plans import within_total_epochs
from rpm_lib.training.progress_record import ProgressRecord
from rpm_lib.training.run_dir import inside_run_dir
from rpm_lib.training.setups import StagePlan
from rpm_lib.training.time_budget import Deadline, TimeBudgetReached, TimeBudgetStop
from rpm_lib.training.trainer import make_trainer


#: What a reloaded checkpoint's refusal advises (a finished stage's weights).
RELOAD_ADVICE = "delete it (and the run's progress.json) or use overwrite=true"


def restart_choices(stage: str) -> str:
    """What a refusal to resume stage ``stage`` from its ``last.ckpt`` (missing, damaged, another's) offers."""
    return (f"restore it, pass restart_stage=true to train stage {stage} again from step 0, or overwrite=true to "
            "start the whole run again")


def run_stage(config: TrainConfig, plan: StagePlan, module: RpmModule, datamodule: RpmDataModule, run_dir: Path,
              callbacks: Sequence[L.Callback], deadline: Deadline | None = None,
              resume_from: Path | None = None) -> tuple[L.Trainer, dict[str, Any]]:
    """Fit one stage, from ``resume_from`` (its ``last.ckpt`` as :func:`resume_point` checked it) or from step 0,
    and summarise it.

    Raises:
        TimeBudgetReached: ``deadline`` stopped the stage; its resumable ``last.ckpt`` is written.
    """
    stage_dir = run_dir / CHECKPOINTS / plan.name
    last = stage_dir / "last.ckpt"
    trainer, checkpoint, early_stopping = make_trainer(config, plan, stage_dir, callbacks, deadline)
    began = time.perf_counter()
    # weights_only: a shared run folder's last.ckpt is untrusted input (never unpickle code from it).
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from is not None else None,
                weights_only=True)
    if trainer.interrupted:
        raise RuntimeError(f"stage {plan.name} was interrupted; rerun with resume=true to continue")
    trainer.strategy.barrier("rpm_stage_end")
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    weights = best if (config.restore_best and best is not None and best.is_file()) else last
    if config.restore_best and weights.is_file():
        load_weights(module, weights)
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
    rows = [r for r in history_rows(run_dir / HISTORY)
            if r.get("stage") == stage and r.get("val_loss") and r.get("val_accuracy")]
    if not rows:
        return None
    best = min(rows, key=lambda r: float(r["val_loss"]))
    return float(best["val_accuracy"])


def _progress_from_checkpoint(path: Path) -> tuple[int, int, float | None, int]:
    """(epochs run, global step, best val loss, early-stopping stopped_epoch) recorded in a Lightning checkpoint."""
    checkpoint = load_checkpoint(path)
    score, stopped_epoch = None, 0
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and state.get("best_model_score") is not None:
            score = float(state["best_model_score"])
        if key.startswith("EarlyStopping"):
            stopped_epoch = int(state.get("stopped_epoch", 0))
    return int(checkpoint["epoch"]) + 1, int(checkpoint["global_step"]), score, stopped_epoch


def load_checkpoint(path: Path, advice: str = RELOAD_ADVICE) -> dict[str, Any]:
    """A Lightning checkpoint read with ``weights_only=True``: tensors and plain containers only, never code
    (``advice`` ends the one line that refuses a file that is not one).

    Checkpoints come from run folders that people share; unpickling arbitrary objects would run their code.
    """
    return load_plain(path, ConfigError, advice)


def resume_point(config: TrainConfig, module: RpmModule, stage: str, run_dir: Path,
                 recorded_step: int) -> tuple[Path | None, str | None]:
    """Where stage ``stage`` goes on: its ``last.ckpt`` (checked to fit ``module`` and to be that stage's resume
    point) or step 0 (None); and, when ``restart_stage`` makes it start again, why (else None).

    Without ``resume`` the stage starts at step 0. So does one with no ``last.ckpt`` whose ``progress.json`` entry
    records no step (``recorded_step`` 0: a stage not begun, or one stopped before its first step): nothing is
    lost. A stage that recorded steps but has no ``last.ckpt``, or whose ``last.ckpt`` is damaged or not its own,
    is refused unless ``restart_stage``: starting it at step 0 would lose those steps without a word.

    Raises:
        ConfigError: one line naming the file and the choices (:func:`restart_choices`).
    """
    last = run_dir / CHECKPOINTS / stage / "last.ckpt"
    if not config.resume:
        return None, None
    if not (last.exists() or last.is_symlink()):
        if not recorded_step:
            return None, None
        problem = f"resume: {last} is missing, but {run_dir / PROGRESS} records stage {stage} at step {recorded_step}"
    else:
        try:
            # a damaged or foreign file is one line here, not Lightning's traceback
            check_fits(module, load_checkpoint(last, ""), last, resume_point_of=stage, advice="")
            return last, None
        except ConfigError as error:
            problem = str(error)
    if not config.restart_stage:
        raise ConfigError(f"{problem}; {restart_choices(stage)}")
    return None, problem


def load_weights(module: RpmModule, path: Path) -> dict[str, Any]:
    """Load the weights of checkpoint ``path`` into ``module``; returns the checkpoint."""
    if not path.is_file():
        raise ConfigError(f"resume: checkpoint {path} is missing; delete progress.json or use overwrite=true")
    checkpoint = load_checkpoint(path)
    check_fits(module, checkpoint, path)
    module.load_state_dict(checkpoint["state_dict"])
    return checkpoint


def check_completed_stage(config: TrainConfig, plan: StagePlan, done: dict[str, Any], weights: Path,
                          checkpoint: dict[str, Any]) -> None:
    """Refuse a completed stage's ``progress.json`` entry whose ``epochs`` or ``global_step`` is not what the stage
    trained: more than this config's limits allow it, other than its ``last.ckpt`` shows, or fewer than the
    checkpoint of its weights (``weights``, loaded as ``checkpoint``) shows.

    The entry goes into ``metrics.json`` as the stage's record (and from there into a shipped model's), so a hand
    edit or a damaged copy must not pass for what was trained. A packed run keeps no ``last.ckpt`` of a completed
    stage; its limits and its weights still bound the entry.

    Raises:
        ConfigError: ``<progress.json>: field 'stages.<name>.<field>' ...; delete it or use overwrite=true``.
    """
    run_dir = Path(config.run_dir)
    path = run_dir / PROGRESS

    def refuse(field: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: field 'stages.{plan.name}.{field}' {why}; delete it or use overwrite=true")

    recorded = {"epochs": done.get("epochs"), "global_step": done.get("global_step")}
    for field, value in recorded.items():
        if value is None:
            raise refuse(field, "is missing from a completed stage")
    if recorded["epochs"] > plan.max_epochs:
        raise refuse("epochs", f"is {recorded['epochs']}, more than this config's limit for stage {plan.name} "
                               f"({plan.max_epochs} epochs)")
    if config.max_steps > 0 and recorded["global_step"] > config.max_steps:
        raise refuse("global_step", f"is {recorded['global_step']}, more than max_steps ({config.max_steps}) allows")
    last = run_dir / CHECKPOINTS / plan.name / "last.ckpt"
    if last.is_file() and not last.is_symlink():
        state = checkpoint if last == weights else load_checkpoint(
            last, "delete it (a completed stage does not read it) or use overwrite=true")
        shown = _epochs_and_steps(state)
        for field, value in zip(recorded, shown or ()):
            if value != recorded[field]:
                raise refuse(field, f"is {recorded[field]}, but {last} shows {value}")
    shown = _epochs_and_steps(checkpoint)
    for field, value in zip(recorded, shown or ()):
        if value > recorded[field]:
            raise refuse(field, f"is {recorded[field]}, fewer than the {value} of its weights {weights}")


def _epochs_and_steps(checkpoint: dict[str, Any]) -> tuple[int, int] | None:
    """(epochs run, global step) that a Lightning checkpoint records; None for one reduced to its weights."""
    epoch, step = checkpoint.get("epoch"), checkpoint.get("global_step")
    if any(isinstance(value, bool) or not isinstance(value, int) or value < 0 for value in (epoch, step)):
        return None
    return epoch + 1, step


#: What Lightning reads from a checkpoint it resumes a stage from (``Trainer.fit(ckpt_path=...)``).
RESUME_POINT_KEYS = ("epoch", "global_step", "pytorch-lightning_version", "loops", "optimizer_states")


def check_fits(module: RpmModule, checkpoint: dict[str, Any], path: Path, resume_point_of: str | None = None,
               advice: str = RELOAD_ADVICE) -> None:
    """One line unless ``checkpoint`` holds exactly ``module``'s weights (names and shapes), and, for the resume
    point of stage ``resume_point_of``, what Lightning resumes from, written by that stage.

    Raises:
        ConfigError: ``resume: checkpoint <path> does not fit this run (...)[; advice]``.
    """
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"resume: checkpoint {path} does not fit this run ({why}){'; ' + advice if advice else ''}")

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


def train_stages(config: TrainConfig, plans: list[StagePlan], module: RpmModule, stages: dict[str, Any],
                 record: ProgressRecord, callbacks: Sequence[L.Callback], deadline: Deadline, began: float
                 ) -> tuple[L.Trainer | None, RpmDataModule | None, dict[str, Any] | None]:
    """Run every stage of ``plans`` that ``stages`` (progress.json's summaries, updated in place) does not list as
    completed: a completed one only reloads its weights.

    Returns:
        ``(trainer, datamodule, unfinished)``: the last stage's Trainer (None when no stage trained in this call)
        and data module, and the unfinished result when the deadline or a stop request ended a stage (else None).
    """
    run_dir = Path(config.run_dir)
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
            raise ConfigError(f"resume: {run_dir}/{PROGRESS} says stage {plan.name} was skipped, but the "
                              "epochs of the stages before it leave it some; use overwrite=true")
        if done and done.get("completed"):
            weights = inside_run_dir(run_dir, done.get("weights"))
            check_completed_stage(config, plan, done, weights, load_weights(module, weights))
            continue
        recorded_step = int((done or {}).get("global_step") or 0)
        resume_from, problem = resume_point(config, module, plan.name, run_dir, recorded_step)
        if problem is not None:
            done = _restart(plan.name, run_dir, problem, recorded_step, stages, record)
        # a stage restarted in an earlier slice keeps saying so once it goes on or finishes
        restarted = {"restarted": done["restarted"]} if done and "restarted" in done else {}
        try:
            trainer, summary = run_stage(config, plan, module, datamodule, run_dir, callbacks, deadline, resume_from)
        except TimeBudgetReached as stop:
            step = stop.global_step if stop.global_step is not None else int((done or {}).get("global_step", 0))
            stages[plan.name] = {"name": plan.name, "completed": False, "global_step": step, **restarted}
            return trainer, datamodule, record.unfinished(config, plan.name, stages, began,
                                                          deadline.stop_requested(), deadline.first_step_s)
        stages[plan.name] = {**summary, **restarted}
        if trainer.is_global_zero:
            record.write(stages)
    return trainer, datamodule, None


def _restart(stage: str, run_dir: Path, problem: str, recorded_step: int, stages: dict[str, Any],
             record: ProgressRecord) -> dict[str, Any]:
    """Start ``stage`` again at step 0 (``restart_stage=true``): say so in one line and record it in
    ``progress.json`` before training, so that its entry and slices never read as if the stage had gone on;
    returns the stage's new entry.

    A damaged ``last.ckpt`` is removed: the stage's first epoch would replace it, and until then a later resume
    would read it again.
    """
    last = run_dir / CHECKPOINTS / stage / "last.ckpt"
    damaged = last.is_file() or last.is_symlink()
    entry = {"name": stage, "completed": False, "global_step": 0,
             "restarted": {"slice": len(record.progress.get("slices") or []) + 1, "lost_global_step": recorded_step,
                           "last_ckpt": "damaged" if damaged else "missing", "by": "restart_stage=true"}}
    stages[stage] = entry
    if record.writer:
        if damaged:
            last.unlink(missing_ok=True)
        print(f"rpm-train: note: {problem}; stage {stage} starts again at step 0 (restart_stage=true"
              f"{'; the damaged file removed' if damaged else ''}), recorded in {run_dir / PROGRESS}",
              file=sys.stderr)
        record.write(stages)
    return entry
