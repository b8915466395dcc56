"""Linear evaluation on cached embeddings (``rpm_lib.training.feature_cache``): the same numbers as the plain stage
up to rounding, the encoder run once per problem instead of once per epoch, and the plain stage, said on stderr,
wherever the cache cannot stand in for it."""
from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rpm_lib.training import feature_cache
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.run import train
from rpm_lib.training.plans import stage_plan


def _linear_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "history.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["stage"] == "linear"]


class _EncoderCalls:
    """Counts the problems the encoder embeds, per stage (patched onto the encoder's forward)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rpm_lib.encoders.base import Encoder

        self.problems: list[int] = []
        forward = Encoder.forward

        def counting(encoder: Any, panels: torch.Tensor) -> torch.Tensor:
            self.problems.append(int(panels.shape[0]))
            return forward(encoder, panels)

        monkeypatch.setattr(Encoder, "forward", counting)


def _mlcl(tiny_config: Callable[..., TrainConfig], run: str, **fields: Any) -> TrainConfig:
    # 42 training and 14 validation problems at batch 6: 7 steps an epoch, 4 epochs of linear evaluation
    return tiny_config(run_dir=str(Path(tiny_config().run_dir).parent / run), setup="mlcl", batch_size=6,
                       max_epochs=1, max_steps=-1, linear_eval_epochs=4, patience=10, max_val_samples=None,
                       limit_val_batches=1.0, limit_test_batches=1.0, max_test_samples=None, image_size=32,
                       save_predictions=False, **fields)


def test_cached_linear_evaluation_gives_the_plain_numbers_and_embeds_each_problem_once(
        tiny_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _EncoderCalls(monkeypatch)
    plain = train(_mlcl(tiny_config, "plain", linear_eval_feature_cache=False))
    embedded_plain, calls.problems = sum(calls.problems), []
    cached = train(_mlcl(tiny_config, "cached"))
    embedded_cached = sum(calls.problems)
    assert cached["test_accuracy"] == plain["test_accuracy"] and cached["val_accuracy"] == plain["val_accuracy"]
    rows_plain = _linear_rows(Path(plain["config"]["run_dir"]))
    rows_cached = _linear_rows(Path(cached["config"]["run_dir"]))
    assert len(rows_cached) == len(rows_plain) == 4
    for a, b in zip(rows_plain, rows_cached):
        assert a["epoch"] == b["epoch"] and a["step"] == b["step"]
        for column in [c for c in a if c not in ("stage", "epoch", "step", "lr")]:
            assert float(b[column]) == pytest.approx(float(a[column]), rel=1e-5, abs=1e-6), (column, a, b)
    # the cached stage embeds its 42 training and 14 validation problems once instead of in each of 4 epochs
    assert embedded_plain - embedded_cached >= 3 * (42 + 14), (embedded_plain, embedded_cached)


def test_the_plan_caches_only_a_frozen_eval_mode_encoder_on_one_plain_view() -> None:
    def linear(**fields: Any) -> Any:
        return next(p for p in stage_plan(TrainConfig(setup="mlcl_aug", **fields)) if p.name == "linear")

    assert linear().cached_features
    assert not linear(linear_eval_feature_cache=False).cached_features
    assert not linear(linear_eval_encoder_mode="train").cached_features  # BatchNorm moves: no fixed embeddings
    assert not linear(head_views="pretrain").cached_features  # augmented views: new inputs every epoch
    assert not any(p.cached_features for p in stage_plan(TrainConfig(setup="mlcl_aug", finetune=True))
                   if p.name != "linear")
    assert not any(p.cached_features for p in stage_plan(TrainConfig(setup="ce_aux_sparse")))


def test_a_cache_too_large_runs_the_plain_stage_and_says_so(
        tiny_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(feature_cache, "MAX_CACHE_BYTES", 1000)
    too_large = train(_mlcl(tiny_config, "too_large"))
    err = capsys.readouterr().err
    assert "rpm-train: note: linear evaluation passes every problem through the frozen encoder in every epoch: " \
           "the embeddings of 56 problems would take" in err
    plain = train(_mlcl(tiny_config, "plain", linear_eval_feature_cache=False))
    assert _linear_rows(Path(too_large["config"]["run_dir"])) == _linear_rows(Path(plain["config"]["run_dir"]))


def test_a_lookup_of_problems_outside_the_cache_is_an_error_not_zeros() -> None:
    features = feature_cache.SplitFeatures(torch.arange(48.0).reshape(2, 8, 3), torch.tensor([1, 4]),
                                           torch.tensor([2, 0, 2, 1]))  # indices 0 and 2 are not cached
    embeddings, targets = features.lookup(torch.tensor([3, 1]))
    assert targets.tolist() == [4, 1] and embeddings[:, 0, 0].tolist() == [24.0, 0.0]
    for missing in (0, 2, 4):  # outside the view, or past every index: an error, never another problem's row
        with pytest.raises(IndexError):
            features.lookup(torch.tensor([missing]))


def test_the_side_by_side_bench_runs_both_ways_and_reports_the_ratio(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(repo / "bench" / "bench_linear_eval_cache.py"), "--per-config", "10",
                           "--linear-epochs", "2", "--out", str(tmp_path), "image_size=32", "batch_size=6"],
                          cwd=repo, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-3].startswith("linear evaluation, cache off: ") and lines[-2].startswith("linear evaluation, cache on")
    assert lines[-1].startswith("cached / plain wall time: ") and "over 2 epochs" in lines[-1]
    refused = subprocess.run([sys.executable, str(repo / "bench" / "bench_linear_eval_cache.py"), "--out",
                              str(tmp_path), "batch_size=0"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "batch_size" in refused.stderr.strip().splitlines()[-1]
