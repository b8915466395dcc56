"""Evaluation metrics: accuracy per group, average precision, rule metrics, rule names."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib.training.metrics import accuracy, accuracy_by_group, average_precision, per_rule_scores, rule_metrics


def test_accuracy_by_group() -> None:
    predicted = np.array([0, 1, 2, 3, 4, 5])
    target = np.array([0, 1, 0, 3, 0, 0])
    groups = np.array([0, 0, 1, 1, 2, 2])
    table = accuracy_by_group(predicted, target, groups, ["a", "b", "c", "unused"])
    assert table == {"a": {"accuracy": 1.0, "num_samples": 2}, "b": {"accuracy": 0.5, "num_samples": 2},
                     "c": {"accuracy": 0.0, "num_samples": 2}}
    assert accuracy(predicted, target) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="out of range"):
        accuracy_by_group(predicted, target, groups + 2, ["a", "b", "c"])


def _brute_force_ap(scores: np.ndarray, labels: np.ndarray) -> float:
    """AP as the precision at each distinct threshold weighted by the recall gained there."""
    total = 0.0
    previous_recall = 0.0
    for threshold in sorted(set(scores.tolist()), reverse=True):
        chosen = scores >= threshold
        recall = (chosen & labels).sum() / labels.sum()
        precision = (chosen & labels).sum() / chosen.sum()
        total += (recall - previous_recall) * precision
        previous_recall = recall
    return float(total)


def test_average_precision() -> None:
    assert average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 0, 1, 0])) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision(np.array([0.1, 0.2]), np.array([0, 0])) != average_precision(
        np.array([0.1, 0.2]), np.array([0, 1]))
    assert np.isnan(average_precision(np.array([0.1, 0.2]), np.array([0, 0])))
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 5, size=30).astype(float)  # many ties
        labels = rng.random(30) < 0.4
        if labels.any():
            assert average_precision(scores, labels) == pytest.approx(_brute_force_ap(scores, labels))


def test_rule_metrics_on_a_hand_example() -> None:
    targets = np.array([[1, 0, 1], [0, 1, 1], [1, 0, 0], [0, 0, 1]])
    # Predictions (logit >= 0): [1,0,1] [1,1,0] [1,0,0] [0,0,1] -> rows 0, 2, 3 exactly right.
    logits = np.array([[2.0, -1.0, 3.0], [0.5, 1.0, -2.0], [4.0, -3.0, -1.0], [-1.0, -2.0, 0.1]])
    out = rule_metrics(logits, targets, names=["x", "y", "z"])
    assert out["exact_match"] == pytest.approx(0.75)
    x = out["per_rule"]["x"]
    assert (x["precision"], x["recall"], x["support"], x["predicted"]) == (pytest.approx(2 / 3), 1.0, 2, 3)
    z = out["per_rule"]["z"]
    assert (z["precision"], z["recall"]) == (1.0, pytest.approx(2 / 3))
    assert z["f1"] == pytest.approx(0.8)
    assert out["micro"]["precision"] == pytest.approx(5 / 6) and out["micro"]["recall"] == pytest.approx(5 / 6)
    expected_map = np.mean([_brute_force_ap(logits[:, j], targets[:, j].astype(bool)) for j in range(3)])
    assert out["mean_average_precision"] == pytest.approx(expected_map)
    with pytest.raises(ValueError, match="equal"):
        rule_metrics(logits[:, :2], targets)


def test_per_rule_scores_by_hand() -> None:
    true = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1]])
    pred = np.array([[1, 1, 0], [0, 0, 0], [0, 0, 1]])
    s = per_rule_scores(true, pred)
    # rule 0: tp 1, fn 1 -> P 1, R 0.5, F1 2/3; rule 1: fp 1 only -> P 0, R 0 (no positives), F1 0
    assert s["precision"][0] == 1.0 and s["recall"][0] == 0.5 and s["f1"][0] == pytest.approx(2 / 3)
    assert (s["precision"][1], s["recall"][1], s["f1"][1]) == (0.0, 0.0, 0.0)
    assert s["support"].tolist() == [2, 0, 2] and s["predicted"].tolist() == [1, 1, 1]
    empty = per_rule_scores(np.zeros((2, 1)), np.zeros((2, 1)))
    assert empty["f1"][0] == 0.0 and empty["support"][0] == 0 and empty["predicted"][0] == 0
    with pytest.raises(ValueError, match="equal"):
        per_rule_scores(true, pred[:, :2])
