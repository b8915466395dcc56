"""Evaluation metrics in numpy: answer accuracy (overall, per configuration) and rule-prediction quality.

All functions take plain arrays (what ``predictions.npz`` stores) so notebooks can recompute them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def accuracy(predicted: np.ndarray, target: np.ndarray) -> float:
    """Fraction of ``predicted == target`` (both int (N,)); NaN for N = 0."""
    predicted, target = np.asarray(predicted), np.asarray(target)
    if predicted.shape != target.shape or predicted.ndim != 1:
        raise ValueError(f"accuracy: predicted {predicted.shape} and target {target.shape} must be equal 1-D shapes")
    return float(np.mean(predicted == target)) if len(target) else float("nan")


def accuracy_by_group(predicted: np.ndarray, target: np.ndarray, groups: np.ndarray,
                      names: Sequence[str]) -> dict[str, dict[str, float | int]]:
    """Accuracy per group (configuration / regime).

    Args:
        predicted, target: int (N,).
        groups: int (N,), index into ``names``.
        names: display name of each group index.

    Returns:
        ``{name: {"accuracy": float, "num_samples": int}}`` for the groups present, in ``names`` order.
    """
    predicted, target, groups = np.asarray(predicted), np.asarray(target), np.asarray(groups)
    if not (predicted.shape == target.shape == groups.shape):
        raise ValueError(f"accuracy_by_group: shapes differ: {predicted.shape}, {target.shape}, {groups.shape}")
    if len(groups) and (groups.min() < 0 or groups.max() >= len(names)):
        raise ValueError(f"accuracy_by_group: group index out of range [0, {len(names)})")
    out: dict[str, dict[str, float | int]] = {}
    for index, name in enumerate(names):
        mask = groups == index
        if mask.any():
            out[name] = {"accuracy": accuracy(predicted[mask], target[mask]), "num_samples": int(mask.sum())}
    return out


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the precision-recall step curve, sum_n (R_n - R_{n-1}) P_n over distinct thresholds.

    Tied scores form one threshold (as scikit-learn's ``average_precision_score``). NaN when ``labels``
    has no positive.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    num_positive = int(labels.sum())
    if num_positive == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    true_positives = np.cumsum(labels)
    # Last index of every run of equal scores = the distinct thresholds.
    distinct = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    tp = true_positives[distinct]
    precision = tp / (distinct + 1)
    recall = tp / num_positive
    recall_step = np.diff(np.r_[0.0, recall])
    return float(np.sum(recall_step * precision))


def rule_metrics(logits: np.ndarray, targets: np.ndarray, names: Sequence[str] | None = None,
                 threshold: float = 0.5) -> dict[str, Any]:
    """Multi-label rule-prediction quality.

    A rule is predicted when sigmoid(logit) >= ``threshold``.

    Args:
        logits: float (N, R) rule-head outputs (before the sigmoid).
        targets: 0/1 (N, R) rule vectors.
        names: R rule names (defaults to ``rule_<j>``).
        threshold: decision threshold on the probability.

    Returns:
        dict with ``exact_match`` (fraction of problems whose whole rule set is right), ``mean_average_precision``
        (mean AP over rules with at least one positive), ``micro`` and ``macro`` precision/recall/F1, and
        ``per_rule``: ``{name: {precision, recall, f1, average_precision, support, predicted}}``. Precision (or
        recall) with an empty denominator is reported as 0; AP of a rule without positives is ``None``.
    """
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets)
    if logits.ndim != 2 or logits.shape != targets.shape:
        raise ValueError(f"rule_metrics: logits {logits.shape} and targets {targets.shape} must be equal (N, R)")
    if targets.size and not np.isin(targets, (0, 1)).all():
        raise ValueError("rule_metrics: targets must be 0/1")
    num_rules = logits.shape[1]
    names = list(names) if names is not None else [f"rule_{j}" for j in range(num_rules)]
    if len(names) != num_rules:
        raise ValueError(f"rule_metrics: {len(names)} names for {num_rules} rules")
    truth = targets.astype(bool)
    # sigmoid(x) >= t  <=>  x >= logit(t); avoids overflow in exp for large logits.
    predicted = logits >= np.log(threshold / (1.0 - threshold))
    scores = per_rule_scores(truth, predicted)
    precision, recall, f1 = scores["precision"], scores["recall"], scores["f1"]
    tp = (predicted & truth).sum(axis=0)
    fp = (predicted & ~truth).sum(axis=0)
    fn = (~predicted & truth).sum(axis=0)
    aps = [average_precision(logits[:, j], truth[:, j]) for j in range(num_rules)]
    valid_aps = [ap for ap in aps if not np.isnan(ap)]
    micro_p = _safe_divide(tp.sum(), tp.sum() + fp.sum())
    micro_r = _safe_divide(tp.sum(), tp.sum() + fn.sum())
    with_support = truth.sum(axis=0) > 0
    return {
        "num_samples": int(logits.shape[0]),
        "threshold": threshold,
        "exact_match": float(np.mean(np.all(predicted == truth, axis=1))) if len(logits) else float("nan"),
        "mean_average_precision": float(np.mean(valid_aps)) if valid_aps else float("nan"),
        "micro": {"precision": float(micro_p), "recall": float(micro_r),
                  "f1": float(_safe_divide(2 * micro_p * micro_r, micro_p + micro_r))},
        # Macro over rules that occur in the targets; never-occurring slots (e.g. sparse40's 2 dead ones) skew it.
        "macro": {"precision": float(np.mean(precision[with_support])) if with_support.any() else float("nan"),
                  "recall": float(np.mean(recall[with_support])) if with_support.any() else float("nan"),
                  "f1": float(np.mean(f1[with_support])) if with_support.any() else float("nan")},
        "per_rule": {
            name: {"precision": float(precision[j]), "recall": float(recall[j]), "f1": float(f1[j]),
                   "average_precision": None if np.isnan(aps[j]) else float(aps[j]),
                   "support": int(truth[:, j].sum()), "predicted": int(predicted[:, j].sum())}
            for j, name in enumerate(names)
        },
    }


def per_rule_scores(true: np.ndarray, predicted: np.ndarray) -> dict[str, np.ndarray]:
    """Per-rule precision, recall, F1 and support of binary predictions: the one convention for per-rule
    scores (``metrics.json``, notebook 05, figures).

    Args:
        true: ``(N, R)`` 0/1 labels.
        predicted: ``(N, R)`` 0/1 predictions (threshold probabilities first).

    Returns:
        ``{"precision", "recall", "f1": float64 (R,), "support": int64 (R,) positives in true,
        "predicted": int64 (R,) positives in predicted}``. A score whose denominator is 0 (a rule never
        predicted, or never present) is 0, as scikit-learn's ``zero_division=0`` does; ``support`` and
        ``predicted`` tell such rules apart.
    """
    true, predicted = np.asarray(true).astype(bool), np.asarray(predicted).astype(bool)
    if true.shape != predicted.shape or true.ndim != 2:
        raise ValueError(f"per_rule_scores: true {true.shape} and predicted {predicted.shape} must be equal (N, R)")
    tp = (true & predicted).sum(axis=0)
    fp = (~true & predicted).sum(axis=0)
    fn = (true & ~predicted).sum(axis=0)
    precision = _safe_divide(tp, tp + fp)
    recall = _safe_divide(tp, tp + fn)
    return {"precision": precision, "recall": recall, "f1": _safe_divide(2 * precision * recall, precision + recall),
            "support": true.sum(axis=0).astype(np.int64), "predicted": predicted.sum(axis=0).astype(np.int64)}


def _safe_divide(numerator: Any, denominator: Any) -> Any:
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)
