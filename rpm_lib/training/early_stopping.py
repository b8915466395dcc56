"""What early stopping has decided so far, replayed from a stage's validation losses in ``history.csv``.

``train()`` ends a stage with Lightning's ``EarlyStopping`` on the validation loss (mode ``min``, ``patience`` and
``min_delta`` from ``TrainConfig``): a loss lower than the best so far by more than ``min_delta`` is better and
resets the count; ``patience`` epochs in a row without a better one end the stage. The same rule, replayed over
the losses a run has written, says which epoch's weights the stage keeps and how many epochs it can still take —
for ``rpm-batch progress`` and the live ETAs, which read run folders without Lightning.
``tests/training/test_early_stopping.py`` checks the replay against Lightning's callback.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StoppingStanding:
    """Early stopping's state after a stage's finished epochs.

    Attributes:
        best_loss: the best validation loss so far (the weights ``restore_best`` keeps), or None before any.
        best_epoch: its epoch, counted from 1 within the stage, or None.
        waited: epochs since then without a better loss (all epochs when there is no best yet).
    """

    best_loss: float | None
    best_epoch: int | None
    waited: int


def replay(losses: list[float], min_delta: float) -> StoppingStanding:
    """Early stopping's standing after the epochs whose validation losses are ``losses`` (in order; NaN for an
    epoch without one, which is never better)."""
    best, epoch, waited = math.inf, None, 0
    for number, loss in enumerate(losses, start=1):
        if loss < best - min_delta:  # False for NaN
            best, epoch, waited = loss, number, 0
        else:
            waited += 1
    return StoppingStanding(None if epoch is None else best, epoch, waited)


def epochs_left(losses: list[float], done: int, limit: int, patience: int, min_delta: float) -> tuple[int, int]:
    """(fewest, most) epochs a stage can still take after ``done`` finished epochs with validation ``losses``, at
    most ``limit`` epochs in all: fewest if no loss is better again, most if the stage runs to its limit. A stage
    without a loss yet (one not begun) takes at least one epoch to set its best, then ``patience`` more."""
    most = max(0, limit - done)
    standing = replay(losses, min_delta)
    fewest = patience + 1 if standing.best_epoch is None else max(0, patience - standing.waited)
    return min(most, fewest), most
