"""``rpm_lib.training.early_stopping``: the replay of early stopping from ``history.csv`` decides what Lightning's
``EarlyStopping``, configured as ``train()`` configures it, decides."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from rpm_lib.training.early_stopping import epochs_left, replay


@pytest.mark.parametrize("min_delta", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(5))
def test_the_replay_keeps_the_epoch_and_the_count_lightning_keeps(seed: int, min_delta: float) -> None:
    rng = np.random.default_rng(seed)
    # a falling loss with noise and plateaus, in float32 as the logged metric is; ties included
    losses = np.round(np.maximum(0.1, 2.0 - 0.05 * np.arange(60) + rng.normal(0, 0.3, 60)), 1).astype(np.float32)
    patience = int(rng.integers(2, 8))
    callback = EarlyStopping(monitor="val/loss", mode="min", patience=patience, min_delta=min_delta, check_finite=True)
    done = []
    for loss in losses:
        stop, _ = callback._evaluate_stopping_criteria(torch.tensor(loss))
        done.append(float(loss))
        standing = replay(done, min_delta)
        assert standing.best_loss == float(callback.best_score) and standing.waited == callback.wait_count
        fewest, most = epochs_left(done, len(done), 100, patience, min_delta)
        assert (fewest == 0) == stop and most == 100 - len(done)
        if stop:
            break


def test_the_epochs_left_of_a_stage() -> None:
    # best 0.4 at epoch 2, then 2 epochs without a better one: patience 3 leaves 1; the limit 20 leaves 16
    assert epochs_left([0.9, 0.4, 0.6, 0.4], done=4, limit=20, patience=3, min_delta=0.0) == (1, 16)
    assert replay([0.9, 0.4, 0.6, 0.4], 0.0).best_epoch == 2  # a tie is not better
    assert replay([0.9, 0.5, 0.45], 0.1).best_loss == 0.5  # 0.05 lower is not better by more than 0.1
    assert epochs_left([], done=0, limit=8, patience=3, min_delta=0.0) == (4, 8)  # the first epoch sets the best
    assert epochs_left([0.9, 0.8], done=2, limit=3, patience=3, min_delta=0.0) == (1, 1)  # the limit comes first
    assert replay([1.0, math.nan, 0.8], 0.0).best_epoch == 3
