"""Time-boxed runs: stop at a step boundary before a wall-clock budget ends, leaving a resumable state.

A run with ``time_budget=SECONDS`` (counted from the start of ``train``) never begins work it cannot finish in
time. The unit of work is one optimiser step; a step that ends an epoch also carries the epoch's validation and
its checkpoint. After every step :class:`TimeBudgetStop` predicts the next unit from what it measured (the
slowest of the last steps, the last validation, the last checkpoint write) with a safety factor; when the
prediction would cross the deadline it writes the stage's ``last.ckpt`` *at this step* (weights, optimiser,
loop counters, callbacks, the data loader's position in its epoch) and raises :class:`TimeBudgetReached`.
``train`` then records the run as unfinished in ``progress.json`` and returns; ``resume=true`` continues at
the next step and, on the CPU, ends with exactly the metrics of an uninterrupted run (the sampler, the
augmentation and the global RNG are functions of (seed, epoch, index, step), see ``samples``).

Under DDP every rank must stop at the same step, so the decision is rank 0's, broadcast every
``DDP_CHECK_EVERY`` steps (a collective per step would make every step wait for the slowest host).
"""
from __future__ import annotations

import collections
import contextlib
import time
from pathlib import Path
from typing import Any

import lightning as L

from rpm_lib.run_folder import STOP_FILE

#: Predicted durations are multiplied by this before they are compared with the time left.
SAFETY_FACTOR = 1.5
#: Steps between two stop decisions when several processes train together (DDP).
DDP_CHECK_EVERY = 20
#: How many recent step durations the prediction looks at (their maximum is used).
RECENT_STEPS = 20


class TimeBudgetReached(Exception):
    """Raised inside ``Trainer.fit`` once the resumable state is written; caught by ``train``.

    Attributes:
        stage: the stage that stopped.
        global_step: optimiser steps the stage had finished (the resumed run starts with the next one); ``None``
            when the stage stopped as it started, before the Trainer had restored its position from ``last.ckpt``:
            the step recorded by the call before stands.
    """

    def __init__(self, stage: str, global_step: int | None) -> None:
        where = "at its start" if global_step is None else f"after step {global_step}"
        super().__init__(f"stage {stage}: time budget reached {where}")
        self.stage = stage
        self.global_step = global_step


class Deadline:
    """A wall-clock deadline on the monotonic clock, and an optional stop-request file.

    Args:
        seconds: the budget; ``None`` = no deadline (every query says there is time unless a stop is requested).
        started: ``time.monotonic()`` at which the budget began (default: now).
        stop_file: when this file exists, the deadline counts as passed.

    Attributes:
        first_step_s: seconds from ``started`` until the first training step of this call had ended (set by
            :class:`TimeBudgetStop`; ``None`` before): the call's start-up, first step included.
    """

    def __init__(self, seconds: float | None, started: float | None = None, stop_file: Path | None = None) -> None:
        self.seconds = seconds
        self.started = time.monotonic() if started is None else started
        self.stop_file = stop_file
        self.first_step_s: float | None = None

    @property
    def active(self) -> bool:
        return self.seconds is not None or self.stop_file is not None

    def stop_requested(self) -> bool:
        return self.stop_file is not None and self.stop_file.exists()

    def left(self) -> float:
        """Seconds until the deadline (``inf`` without one; negative once it has passed or a stop is requested)."""
        if self.stop_requested():
            return float("-inf")
        if self.seconds is None:
            return float("inf")
        return self.started + self.seconds - time.monotonic()

    def allows(self, seconds: float) -> bool:
        """Whether work predicted to take ``seconds`` (before the safety factor) ends before the deadline."""
        return SAFETY_FACTOR * seconds < self.left()


def describe_unfinished(metrics: dict[str, Any], time_budget: float | None, run_dir: str | Path) -> str:
    """What ended an unfinished run, and where: ``"<cause> ended the run in <stage> after step <n>"``.

    Args:
        metrics: ``train``'s unfinished result (``stage``, ``global_step``, ``stop_requested``).
        time_budget: the run's ``time_budget`` (seconds; ``None`` when only a stop request could end it).
        run_dir: the run folder (its stop-request file is named in the cause).
    """
    if metrics.get("stop_requested") or time_budget is None:
        cause = (f"a stop request ({Path(run_dir) / STOP_FILE}, written on a signal: Ctrl-C, SIGTERM, a scheduler's "
                 "time limit; or by rpm-batch when the run went on past the batch's time budget)")
    else:
        cause = f"the time budget ({time_budget:g} s)"
    step = "" if metrics.get("global_step") is None else f" after step {metrics['global_step']}"
    stuck = ""
    if metrics.get("made_progress") is False and not metrics.get("stop_requested") and time_budget is not None:
        # A stage begins only with SAFETY_FACTOR x max(2 s, 5 % of the budget) left, after the start-up.
        stuck = ("; this call trained no step (start-up and the time a stage needs to begin used the budget): "
                 "give a larger time_budget")
    return f"{cause} ended the run in {metrics.get('stage')}{step}{stuck}"


def stage_start_seconds(deadline: Deadline) -> float:
    """Time a stage (or the final evaluation, before its own time is known) needs to be worth starting."""
    return max(2.0, 0.05 * float(deadline.seconds or 0.0)) if deadline.seconds is not None else 0.0


class TimeBudgetStop(L.Callback):
    """Stop a stage at a step boundary when the next step (and the validation it would trigger) would not end
    before ``deadline``; write a resumable ``last.ckpt`` first.

    Must come after the other callbacks in the Trainer's list, so their ``on_train_batch_end`` has run when
    the checkpoint is written.

    Args:
        deadline: the run's :class:`Deadline`.
        stage: stage name (for the exception and the log line).
        last_checkpoint: the stage's ``last.ckpt`` path.
        max_steps: the stage's step limit (``-1`` = none): the step reaching it also validates.
    """

    def __init__(self, deadline: Deadline, stage: str, last_checkpoint: Path, max_steps: int = -1) -> None:
        self.deadline = deadline
        self.stage = stage
        self.last_checkpoint = Path(last_checkpoint)
        self.max_steps = max_steps
        self._step_seconds: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._last_mark: float | None = None
        self._validation_started: float | None = None
        self.validation_seconds: float | None = None
        self.save_seconds: float | None = None
        self._val_batches_estimate: int | None = None

    # -- measurements ------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A stage starts only with time for its first steps: a twentieth of the budget, at least 2 s. Decided here,
        # inside the Trainer, so that under DDP every rank takes rank 0's decision, and before the module's own
        # on_fit_start (Lightning calls the callbacks' first), whose start-up work (re-estimating BatchNorm
        # statistics, embedding a linear stage's problems) a stage without time for a step would throw away.
        if self.deadline.active and not self._allows(trainer, stage_start_seconds(self.deadline)):
            raise TimeBudgetReached(self.stage, None)  # the loops' counters are restored after on_fit_start

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The first step of an epoch also starts the loader's iteration: it is measured like any other.
        self._last_mark = time.monotonic()
        if self.deadline.active and self._step_seconds and not self._allows(trainer, self._predict_next(trainer, 0)):
            # The epoch-end checkpoint written after the last validation is already the resumable state.
            raise TimeBudgetReached(self.stage, int(trainer.global_step))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_started = time.monotonic()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validation_started is not None:
            # Includes the callbacks before this one (ModelCheckpoint writes last/best here).
            self.validation_seconds = time.monotonic() - self._validation_started

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.monotonic()
        if self.deadline.first_step_s is None:
            self.deadline.first_step_s = round(now - self.deadline.started, 3)
        if self._last_mark is not None:
            self._step_seconds.append(now - self._last_mark)
        self._last_mark = now
        if not self.deadline.active:
            return
        if self._validates_after(trainer, batch_idx):
            # Validation follows this step: a checkpoint written now would make a resumed run skip it (Lightning
            # counts the epoch as done). The step before already counted this validation in its prediction.
            return
        if trainer.world_size > 1 and trainer.global_step % DDP_CHECK_EVERY:
            return
        if self._allows(trainer, self._predict_next(trainer, batch_idx + 1) + self._predict_save()):
            return
        began = time.monotonic()
        trainer.save_checkpoint(self.last_checkpoint)
        self.save_seconds = time.monotonic() - began
        raise TimeBudgetReached(self.stage, int(trainer.global_step))

    # -- predictions -------------------------------------------------------------------------------
    def _allows(self, trainer: L.Trainer, seconds: float) -> bool:
        decision = self.deadline.allows(seconds)
        if trainer.world_size > 1:
            decision = bool(trainer.strategy.broadcast(decision, src=0))
        return decision

    def _predict_next(self, trainer: L.Trainer, batch_idx: int) -> float:
        """Seconds the step of ``batch_idx`` (and the validation it may trigger) is predicted to take."""
        need = self._predict_step()
        if self._validates_after(trainer, batch_idx):
            need += self._predict_validation(trainer)
        return need

    def _predict_step(self) -> float:
        return max(self._step_seconds) if self._step_seconds else 0.0

    def _predict_validation(self, trainer: L.Trainer) -> float:
        if self.validation_seconds is not None:
            return self.validation_seconds
        # Not measured yet: a validation batch, and a batch that re-estimates BatchNorm statistics before it, costs
        # at most a training step (forward only), plus one save.
        before = getattr(trainer.lightning_module, "batches_before_validation", None)
        batches = self._validation_batches(trainer) + (int(before()) if callable(before) else 0)
        return batches * self._predict_step() + self._predict_save()

    def _validation_batches(self, trainer: L.Trainer) -> int:
        """Batches of one validation. Before the first validation of a fit Lightning has not counted them (a run
        resumed near the end of an epoch): then they are counted from the datamodule's loader, once."""
        counted = sum(int(n) for n in (trainer.num_val_batches or [0]))
        if counted:
            return counted
        if self._val_batches_estimate is None:
            self._val_batches_estimate = 0
            datamodule = getattr(trainer, "datamodule", None)
            if datamodule is not None and hasattr(datamodule, "val_dataloader"):
                with contextlib.suppress(TypeError, NotImplementedError):  # a loader without a length
                    batches = len(datamodule.val_dataloader())
                    limit = trainer.limit_val_batches
                    if isinstance(limit, int):
                        batches = min(batches, limit)
                    elif limit is not None:
                        batches = int(batches * float(limit))
                    self._val_batches_estimate = batches
        return self._val_batches_estimate

    def _predict_save(self) -> float:
        return self.save_seconds if self.save_seconds is not None else 1.0

    def _validates_after(self, trainer: L.Trainer, batch_idx: int) -> bool:
        """Whether the step of ``batch_idx`` ends the epoch or reaches the step limit, so validation follows it.

        Called after a step (``global_step`` counts it) for that step, or for the next one with ``batch_idx + 1``.
        """
        last_of_epoch = batch_idx + 1 >= int(trainer.num_training_batches)
        step = trainer.global_step + (batch_idx - trainer.fit_loop.epoch_loop.batch_idx)
        reaches_limit = self.max_steps > 0 and step >= self.max_steps
        return last_of_epoch or reaches_limit
