"""Generalisation-regime figures: which rules govern the held-out attribute in train/val vs test, and a run's
accuracy in distribution vs out of distribution per configuration. Accuracies are in percent."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from rpm_lib.viz.evaluation import CHANCE_PERCENT, finish_accuracy_bars


def plot_rule_mix(mix: Mapping[str, Mapping[str, Mapping[str, float]]], title: str | None = None) -> Figure:
    """Heatmaps of rule probabilities, one panel per split kind.

    Args:
        mix: ``{split kind: {row label: {rule label: probability}}}``, e.g. ``{"train / val": {"Center · Grid":
            {"Constant": 1.0}}, "test": {...}}``; rows are typically "configuration · component" and columns the
            rules of the held-out group. Missing entries are 0.
        title: figure title.
    Returns:
        One image axes per split kind (rows and columns shared), probabilities written in the cells.
    """
    kinds = list(mix)
    if not kinds:
        raise ValueError("plot_rule_mix needs at least one split kind")
    rows = list(dict.fromkeys(r for kind in kinds for r in mix[kind]))
    cols = list(dict.fromkeys(c for kind in kinds for r in mix[kind].values() for c in r))
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 + 1.0 * len(cols) * len(kinds), 0.9 + 0.32 * len(rows)),
                             sharey=True, layout="constrained", squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        data = np.array([[mix[kind].get(r, {}).get(c, 0.0) for c in cols] for r in rows], dtype=float)
        ax.imshow(data, cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                if data[i, j] > 0:
                    ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if data[i, j] > 0.6 else "black")
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
        ax.set_title(kind, fontsize=10)
    axes[0][0].set_yticks(range(len(rows)), rows, fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_in_vs_out(in_distribution: Mapping[str, float], out_of_distribution: Mapping[str, float],
                   no_shift: Sequence[str] = (), title: str | None = None,
                   labels: tuple[str, str] = ("in distribution", "out of distribution")) -> Figure:
    """Grouped bars per configuration: accuracy in distribution beside out of distribution, chance dashed.

    Args:
        in_distribution / out_of_distribution: ``{configuration: accuracy %}`` (e.g. "Average", "Center", ...).
        no_shift: configurations whose "out-of-distribution" test is not shifted at all (A/Position's Center,
            L-R, U-D and O-IC): their bars are hatched and labelled, so nobody reads them as generalisation.
    """
    names = list(dict.fromkeys([*in_distribution, *out_of_distribution]))
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 * len(names) + 3), 3.6))
    inside = ax.bar(x - 0.2, [in_distribution.get(n, np.nan) for n in names], 0.4, label=labels[0])
    outside = ax.bar(x + 0.2, [out_of_distribution.get(n, np.nan) for n in names], 0.4, label=labels[1])
    ax.bar_label(inside, fmt="%.1f", fontsize=7)
    ax.bar_label(outside, fmt="%.1f", fontsize=7)
    for k, name in enumerate(names):
        if name in no_shift:
            outside[k].set_hatch("//")
            outside[k].set_alpha(0.5)
    ax.axhline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance")
    if any(n in no_shift for n in names):
        ax.bar(0, 0, color="white", edgecolor="black", hatch="//", label="test not shifted here")
    finish_accuracy_bars(fig, ax, x, names, title)
    return fig
