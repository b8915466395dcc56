"""Rule-prediction figures (true vs predicted rule vectors, per-rule F1) and rule sets in words compared.
Slot names come from ``RuleEncoding.slot_names()`` (:mod:`rpm_lib.rule_encodings`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def plot_rule_heatmap(true: np.ndarray, predicted: np.ndarray, names: Sequence[str], max_problems: int = 40,
                      only_used: bool = True, title: str | None = None, xlabel: str = "rule") -> Figure:
    """True rule vectors beside predicted probabilities for the first ``max_problems`` problems.

    Args:
        true: ``(N, R)`` 0/1 labels.
        predicted: ``(N, R)`` probabilities in [0, 1].
        names: ``R`` slot names (``RuleEncoding.slot_names``).
        only_used: drop slots that are 0 in ``true`` and < 0.5 in ``predicted`` for all shown problems.
        xlabel: once, below both panels (e.g. ``rules.component_legend()`` when configurations are mixed).
    """
    true, predicted = np.asarray(true, float), np.asarray(predicted, float)
    if true.shape != predicted.shape or true.shape[1] != len(names):
        raise ValueError(f"plot_rule_heatmap: true {true.shape}, predicted {predicted.shape}, {len(names)} names")
    true, predicted = true[:max_problems], predicted[:max_problems]
    cols = np.arange(true.shape[1])
    if only_used:
        cols = np.flatnonzero((true > 0).any(0) | (predicted >= 0.5).any(0))
        if cols.size == 0:
            cols = np.arange(true.shape[1])
    # Tall enough for the rule names below the axes at a readable size (8 pt).
    fig, axes = plt.subplots(1, 2, figsize=(12, 7), sharey=True, layout="constrained")
    for ax, data, label in ((axes[0], true, "true rules"), (axes[1], predicted, "predicted probability")):
        im = ax.imshow(data[:, cols], aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(len(cols)), [names[c] for c in cols], rotation=90, fontsize=8)
        ax.set_title(label, fontsize=10)
    axes[0].set_ylabel("problem")
    fig.colorbar(im, ax=axes, fraction=0.03, label="1 = rule present / predicted")
    fig.supxlabel(xlabel, fontsize=9)  # once, under both panels
    if title:
        fig.suptitle(title)
    return fig


def plot_per_rule_f1(scores: Mapping[str, np.ndarray], names: Sequence[str], min_support: int = 1,
                     title: str | None = None) -> Figure:
    """Horizontal bars of per-rule F1 (from ``rpm_lib.training.metrics.per_rule_scores``) for rules with
    ``support >= min_support``."""
    f1, support = np.asarray(scores["f1"]), np.asarray(scores["support"])
    keep = np.flatnonzero(support >= min_support)
    # 8 pt rule names, a row each: readable at the notebook's width, however many rules there are.
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.24 * len(keep) + 1.2)))
    y = np.arange(len(keep))
    ax.barh(y, np.nan_to_num(f1[keep]), color="tab:blue")
    ax.set_yticks(y, [f"{names[i]} (n={support[i]})" for i in keep], fontsize=8)
    ax.set_ylabel("rule (n: test problems that have it)")
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("F1")
    ax.set_title(title or "per-rule F1")
    fig.tight_layout()
    return fig


def compare_rules(true_rules: Sequence[str], predicted_rules: Sequence[str]) -> dict[str, list[str]]:
    """``{"correct", "missing", "extra"}``: rules in both, only in ``true_rules``, only in ``predicted_rules``."""
    predicted_set, true_set = set(predicted_rules), set(true_rules)
    return {"correct": [r for r in true_rules if r in predicted_set],
            "missing": [r for r in true_rules if r not in predicted_set],
            "extra": [r for r in predicted_rules if r not in true_set]}


def rule_comparison_lines(true_rules: Sequence[str], predicted_rules: Sequence[str]) -> list[str]:
    """One line per rule, marked ``ok`` (true and predicted), ``missing`` (true only) or ``extra`` (predicted
    only), in that order; the marks are padded to one width so the rules line up in a monospace font."""
    diff = compare_rules(true_rules, predicted_rules)
    return [f"{mark:<8}{rule}" for key, mark in (("correct", "ok"), ("missing", "missing"), ("extra", "extra"))
            for rule in diff[key]]


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float64."""
    logits = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(logits)
    pos = logits >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-logits[pos]))
    e = np.exp(logits[~pos])
    out[~pos] = e / (1.0 + e)
    return out
