"""Evaluation figures: accuracies against references and chance, answer confusions, Table 1 comparisons and
ablation curves. Accuracies are in percent; every function returns a ``Figure`` of fixed size."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


#: Chance level of an 8-way answer choice, percent.
CHANCE_PERCENT: float = 100.0 / 8


def confusion_matrix(correct: Sequence[int] | np.ndarray, chosen: Sequence[int] | np.ndarray,
                     num_classes: int = 8) -> np.ndarray:
    """int64 ``(num_classes, num_classes)``: ``[i, j]`` counts problems with answer ``i`` where ``j`` was chosen."""
    correct, chosen = np.asarray(correct), np.asarray(chosen)
    if correct.shape != chosen.shape or correct.ndim != 1:
        raise ValueError(f"confusion_matrix: correct {correct.shape} and chosen {chosen.shape} must be equal 1-D")
    for name, arr in (("correct", correct), ("chosen", chosen)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise ValueError(f"confusion_matrix: {name} has values outside 0..{num_classes - 1}")
    out = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(out, (correct.astype(np.int64), chosen.astype(np.int64)), 1)
    return out


def legend_outside(ax) -> None:
    """The legend right of the axes: inside, it covered the last bars (O-IG, MLCL+AUG's paper bar)."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def finish_accuracy_bars(fig: Figure, ax, x: np.ndarray, names: Sequence[str], title: str | None) -> None:
    """The common frame of grouped accuracy bars: category names, a 0-105 % axis, the legend outside, title."""
    ax.set_xticks(x, names, rotation=0, fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("accuracy (%)")
    legend_outside(ax)
    if title:
        ax.set_title(title)
    fig.tight_layout()


def plot_accuracy_bars(accuracy: Mapping[str, float], reference: Mapping[str, float] | None = None,
                       reference_label: str = "paper", label: str = "this run", title: str | None = None,
                       chance: float | None = CHANCE_PERCENT) -> Figure:
    """Bar chart of accuracies (percent) per category, optionally beside reference bars and a chance line."""
    names = list(accuracy)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.4 if reference else 0.7
    bars = ax.bar(x - (width / 2 if reference else 0), [accuracy[n] for n in names], width, label=label)
    ax.bar_label(bars, fmt="%.1f", fontsize=7)
    if reference:
        ref = [reference.get(n, np.nan) for n in names]
        rbars = ax.bar(x + width / 2, ref, width, label=reference_label, alpha=0.6)
        ax.bar_label(rbars, fmt="%.1f", fontsize=7)
    if chance is not None:
        ax.axhline(chance, color="grey", ls="--", lw=1, label="chance")
    finish_accuracy_bars(fig, ax, x, names, title)
    return fig


def plot_confusion(matrix: np.ndarray, title: str | None = None, normalise: bool = True) -> Figure:
    """Heatmap of a ``confusion_matrix`` (rows: correct answer, columns: chosen); cells show counts."""
    matrix = np.asarray(matrix)
    shown = matrix / np.maximum(matrix.sum(1, keepdims=True), 1) if normalise else matrix
    fig, ax = plt.subplots(figsize=(4.5, 4))
    im = ax.imshow(shown, cmap="Blues", vmin=0, vmax=1 if normalise else None)
    n = len(matrix)
    for i in range(n):
        for j in range(n):
            if matrix[i, j]:
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if shown[i, j] > 0.5 * (shown.max() or 1) else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("chosen answer")
    ax.set_ylabel("correct answer")
    fig.colorbar(im, ax=ax, fraction=0.046, label="row fraction" if normalise else "count")
    ax.set_title(title or "chosen vs correct answer")
    fig.tight_layout()
    return fig


def plot_ablation(series: Mapping[str, Sequence[Any]], parameter: str, reference: Mapping[str, float] | None = None,
                  log_x: bool = False, title: str | None = None) -> Figure:
    """Accuracy vs a parameter (``results.ablation_series``: points with ``value, mean, std``), error bars = std.

    ``reference`` adds dotted horizontal lines named in the legend (e.g. the paper's number at one setting).
    """
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in series.items():
        xs = [p.value for p in points]
        ys = [p.mean for p in points]
        es = [0.0 if math.isnan(p.std) else p.std for p in points]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    # Named in the legend, each its own colour: as text on the lines, close values (HriNet 20.x, CoPINet
    # 19.x) wrote over each other.
    for k, (name, value) in enumerate((reference or {}).items()):
        ax.axhline(value, ls=":", lw=1.2, color=f"C{len(series) + k}", label=name)
    if log_x:
        ax.set_xscale("log", base=2)
    # The whole 0-100 range with chance marked, as every accuracy axis here: a 0.3-point wobble stays small.
    ax.axhline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance")
    ax.set_ylim(0, 100)
    ax.set_xlabel(parameter)
    ax.set_ylabel("average test accuracy (%)")
    legend_outside(ax)
    if not series:
        ax.text(0.5, 0.5, f"no runs vary {parameter}", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title or f"ablation: {parameter}")
    fig.tight_layout()
    return fig


def plot_table1_comparison(rows: Sequence[Any], title: str | None = None) -> Figure:
    """Grouped bars of the average accuracy per (encoder, setup): ours (± std) beside the paper's.

    ``rows`` are ``results.Table1Row``.
    """
    labels = [f"{r.encoder}\n{r.setup}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(rows) + 3), 3.5))  # room for "CE+AUX-sparse" under each pair
    ours = [r.average for r in rows]
    errs = [0.0 if math.isnan(r.std) else r.std for r in rows]
    bars = ax.bar(x - 0.2, ours, 0.4, yerr=errs, capsize=3, label="ours (± std over seeds)")
    ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    paper = ax.bar(x + 0.2, [r.paper.average if r.paper else np.nan for r in rows], 0.4, label="paper", alpha=0.6)
    ax.bar_label(paper, fmt="%.1f", fontsize=7)
    ax.axhline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("average test accuracy (%)")
    legend_outside(ax)
    ax.set_title(title or "Table 1: ours vs paper")
    fig.tight_layout()
    return fig


def plot_setup_accuracies(rows: Sequence[Any], seed_values: Mapping[str, Sequence[float]] | None = None,
                          title: str | None = None) -> Figure:
    """Bars of the average test accuracy per row (mean ± std over seeds), each seed as a dot, chance dashed.

    Args:
        rows: ``results.Table1Row``; the bar label is ``claims.row_key(row)`` (setup, or setup + ablation).
        seed_values: optional row key -> per-seed averages (percent) drawn as dots.
    """
    from rpm_lib.results.claims import row_key

    keys = [row_key(r) for r in rows]
    y = np.arange(len(rows))[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    errs = [0.0 if math.isnan(r.std) else r.std for r in rows]
    ax.barh(y, [r.average for r in rows], xerr=errs, capsize=3, color="#4c72b0", alpha=0.8)
    for yi, key in zip(y, keys):
        values = (seed_values or {}).get(key, [])
        ax.plot(values, [yi] * len(values), "o", color="#dd8452", ms=4, zorder=3)
    ax.axvline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance (12.5 %)")
    ax.set_yticks(y, keys, fontsize=8)
    ax.set_xlabel("average test accuracy (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "test accuracy per setup (bars: mean ± std over seeds; dots: seeds)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_accuracy_intervals(rows: Sequence[dict[str, Any]], title: str | None = None,
                            confidence: float = 0.99) -> Figure:
    """Accuracy per configuration on fresh problems with its interval, the recorded test accuracy marked.

    Args:
        rows: ``rpm_lib.pretrained.evaluate.accuracy_rows``: ``configuration``, ``accuracy``, ``low``, ``high``
            (fractions) and ``recorded`` (a fraction, or None) per configuration, ``All`` last.
        confidence: of the intervals, for the legend.
    Returns:
        One axes: a bar per row (``All`` darker), error bars from ``low`` to ``high``, a black diamond at the
        recorded accuracy, chance dashed; accuracies in percent.
    """
    names = [row["configuration"] for row in rows]
    x = list(range(len(rows)))
    accuracy = [100 * row["accuracy"] for row in rows]
    below = [100 * (row["accuracy"] - row["low"]) for row in rows]
    above = [100 * (row["high"] - row["accuracy"]) for row in rows]
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    colours = ["#1f4e79" if name == "All" else "#6baed6" for name in names]
    bars = ax.bar(x, accuracy, 0.6, color=colours, yerr=[below, above], capsize=3, ecolor="#333333",
                  label=f"fresh problems ({confidence:.0%} interval)")
    ax.bar_label(bars, fmt="%.1f", fontsize=7, label_type="center", color="white")
    recorded = [(i, 100 * row["recorded"]) for i, row in zip(x, rows) if row.get("recorded") is not None]
    if recorded:
        ax.scatter([i for i, _ in recorded], [v for _, v in recorded], marker="D", s=28, color="black", zorder=3,
                   label="recorded test accuracy")
    ax.axhline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance")
    finish_accuracy_bars(fig, ax, x, names, title)
    return fig
