"""``TrainConfig.logger``: TensorBoard event files hold history.csv's scalars and the per-term losses, per stage,
inside the run folder; csv (the default) writes none; resuming and overwriting keep the folder consistent."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.history import history_rows
from rpm_lib.training.run import train


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag -> [(step, value)] of every event file in ``folder``."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _values(points: list[tuple[int, float]]) -> list[float]:
    return [round(value, 5) for _, value in points]


def _column(rows: list[dict[str, str]], name: str) -> list[float]:
    return [round(float(row[name]), 5) for row in rows]


def test_tensorboard_events_hold_the_history_scalars_and_stage_losses(tiny_config: Callable[..., TrainConfig]):
    config = tiny_config(setup="mlcl", logger="tensorboard", max_epochs=2, linear_eval_epochs=1, max_steps=-1,
                         limit_train_batches=2)
    train(config)
    run_dir = Path(config.run_dir)
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == ["linear", "pretrain"]
    rows = history_rows(run_dir / "history.csv")
    expected_terms = {"pretrain": {"aux", "mlcl"}, "linear": {"answer"}}  # the stage's loss terms (beta, gamma > 0)
    for stage, terms in expected_terms.items():
        scalars = _scalars(run_dir / "tensorboard" / stage)
        stage_rows = [r for r in rows if r["stage"] == stage]
        assert len(stage_rows) == (2 if stage == "pretrain" else 1)
        # history.csv's columns, epoch by epoch
        assert _values(scalars["train/epoch_loss"]) == _column(stage_rows, "train_loss")
        assert _values(scalars["val/loss"]) == _column(stage_rows, "val_loss")
        assert _values(scalars["lr-Adam"]) == _column(stage_rows, "lr")
        if stage == "linear":
            assert _values(scalars["val/accuracy"]) == _column(stage_rows, "val_accuracy")
        else:
            assert "val/accuracy" not in scalars  # pre-training trains no scoring head (empty in history.csv too)
        steps = [step for step, _ in scalars["val/loss"]]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        # the per-term losses of the stage, in training and validation, one value per epoch
        for term in terms:
            assert len(scalars[f"train/{term}"]) == len(scalars[f"val/{term}"]) == len(stage_rows), (stage, term)

    # overwrite deletes the old events with the rest of the run; csv writes none
    train(TrainConfig(**{**config.to_dict(), "overwrite": True, "logger": "csv"}))
    assert not (run_dir / "tensorboard").exists()


def test_a_missing_tensorboard_package_is_one_line(tiny_config: Callable[..., TrainConfig], monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    config = tiny_config(logger="tensorboard")
    with pytest.raises(ConfigError, match=r"^config field 'logger': .*rpm_lib\[tensorboard\]") as error:
        train(config)
    assert "\n" not in str(error.value)
    assert not Path(config.run_dir).exists()  # refused before anything was written
    with pytest.raises(ConfigError, match="logger"):
        tiny_config(logger="wandb")
