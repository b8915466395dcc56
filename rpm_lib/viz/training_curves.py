"""Training curves from ``history.csv`` columns (``rpm_lib.training.history.history_columns``): losses and
accuracies over epochs, stages marked."""
from __future__ import annotations

import os
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from rpm_lib.viz.evaluation import CHANCE_PERCENT


def history_x(history: Mapping[str, np.ndarray]) -> tuple[np.ndarray, str, list[tuple[float, str]]]:
    """x values for ``plot_history``: epochs counted across stages.

    ``history.csv`` restarts ``epoch`` (and ``step``) at every stage (MLCL: pretrain, then linear). Stage k's
    epochs are shifted by the number of epochs of the stages before it, so curves follow each other.

    Returns:
        ``(x float (N,), label, boundaries)`` where ``boundaries`` are ``(x where a stage starts, stage name)``.
    """
    n = len(next(iter(history.values()))) if history else 0
    if "epoch" not in history:
        return np.arange(n, dtype=float), "validation #", []
    epochs = np.asarray(history["epoch"], float)
    if "stage" not in history:
        return epochs, "epoch", []
    stages = [str(s) for s in history["stage"]]
    x = np.empty(n)
    offset, boundaries, current, last_epoch = 0.0, [], None, 0.0
    for i, (stage, epoch) in enumerate(zip(stages, epochs)):
        if stage != current:
            if current is not None:
                offset += last_epoch + 1
            boundaries.append((offset, stage))
            current = stage
        x[i] = offset + epoch
        last_epoch = epoch
    return x, "epoch (all stages)", boundaries


def plot_history(history: Mapping[str, np.ndarray], title: str | None = None) -> Figure:
    """Loss curves (left) and accuracy curves (right) from ``rpm_lib.training.history.history_columns``.

    Columns containing ``loss`` go left, columns containing ``acc`` right; the x axis counts epochs across
    stages (``history_x``) with a dashed line and the stage name where each stage starts. NaN points
    (e.g. ``val_accuracy`` during MLCL pre-training) are skipped. Accuracies are drawn in percent on a fixed
    0-100 axis with the chance level (12.5 %) dashed, so a wobble of a few tenths of a point stays a wobble.
    """
    xs, xlabel, boundaries = history_x(history)
    numeric = {k: np.asarray(v) for k, v in history.items()
               if k not in ("epoch", "step", "stage") and np.asarray(v).dtype.kind == "f"}
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key, ylabel in ((ax_loss, "loss", "loss"), (ax_acc, "acc", "accuracy")):
        plotted = 0
        for name, values in sorted(numeric.items()):
            if key not in name:
                continue
            ok = ~np.isnan(values)
            if ok.any():
                shown = 100 * values[ok] if key == "acc" else values[ok]
                ax.plot(xs[ok], shown, marker="." if ok.sum() < 30 else None, label=name)
                plotted += 1
        if key == "acc":
            ax.set_ylim(0, 100)
            ax.axhline(CHANCE_PERCENT, color="grey", ls=":", lw=1, label="chance (12.5 %)")
            ylabel = "accuracy (%)"
        for x0, stage in boundaries if len(boundaries) > 1 else []:
            ax.axvline(x0, color="grey", ls="--", lw=0.8)
            # Above the plot area, where no legend or curve can cover the stage name.
            ax.annotate(stage, (x0, 1.01), xycoords=("data", "axes fraction"), fontsize=7, va="bottom", ha="center")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, not 0.5 steps
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if plotted:
            # Curves live low on a 0-100 accuracy axis: the upper right stays free of data there.
            ax.legend(fontsize=7, loc="upper right" if key == "acc" else "best")
        else:
            ax.text(0.5, 0.5, f"no '{key}' values", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


#: Runs up to which ``plot_runs_accuracy`` keeps its legend inside the axis.
LEGEND_INSIDE = 10
#: Characters of a run name that ``plot_runs_accuracy`` shows in its legend.
LEGEND_NAME_CHARS = 48
#: A reference line several runs share (seeds of one setup): none of their colours alone.
SHARED_REFERENCE_COLOUR = "0.25"


def _legend_name(name: str) -> str:
    """``name`` on one line and at most ``LEGEND_NAME_CHARS`` long (its start and end, "…" between): a run folder
    named with 200 characters pushed the axis into a sliver at the figure's right edge."""
    name = " ".join(name.splitlines())
    if len(name) <= LEGEND_NAME_CHARS:
        return name
    half = (LEGEND_NAME_CHARS - 1) // 2
    return f"{name[:half]}…{name[-half:]}"


def _draw_references(ax, lines, references: Mapping[str, float], right: float) -> bool:
    """Dashed reference lines for the runs in ``lines`` (name, colour, epochs x, accuracies) that have an accuracy
    and a reference: one per distinct value, in the run's colour, or dark grey and labelled when several runs share
    it. Returns whether any was shared."""
    runs_by_value: dict[float, list[tuple[str, float]]] = {}
    for name, colour, xs, _ in lines:
        if xs.size and name in references:
            runs_by_value.setdefault(float(references[name]), []).append((name, colour, float(xs[0])))
    for value, runs in runs_by_value.items():
        start = min(x for _, _, x in runs)
        if len(runs) == 1:
            ax.hlines(value, start, right, color=runs[0][1], ls="--", lw=0.9)
        else:
            ax.hlines(value, start, right, color=SHARED_REFERENCE_COLOUR, ls="--", lw=0.9)
            # the runs' common name start says whose line it is (main/setup-ce__seed-* for the seeds of CE)
            common = os.path.commonprefix([name for name, _, _ in runs])
            whose = f"{_legend_name(common)}*, " if common else ""
            ax.annotate(f"{value:.1f} % ({whose}{len(runs)} runs)", (right, value), xytext=(-2, 2),
                        textcoords="offset points", ha="right", va="bottom", fontsize=6.5,
                        color=SHARED_REFERENCE_COLOUR)
    return any(len(runs) > 1 for runs in runs_by_value.values())


def plot_runs_accuracy(curves: Mapping[str, Mapping[str, np.ndarray]], references: Mapping[str, float] | None = None,
                       finished: Mapping[str, bool] | None = None, notes: Mapping[str, str] | None = None,
                       reference_label: str = "reference", title: str | None = None) -> Figure:
    """Validation accuracy of several runs over their epochs, one line each: a batch's or campaign's progress.

    Args:
        curves: run name -> its ``history_columns``. The x axis counts epochs across stages (``history_x``), so an
            MLCL run's line starts after its pre-training, whose epochs have no accuracy (NaN, skipped).
        references: run name -> a reference accuracy in percent (e.g. the paper's Table 1 test average), drawn as
            a dashed line in the run's colour from its first epoch to the right edge. Several runs with the same
            reference (seeds of one setup) share one dark grey dashed line, from the earliest of their first
            epochs, labelled with its value at the right edge: one line per run would lie on top of each other,
            showing only the last run's colour.
        finished: run name -> whether it has finished; a finished run's last point is a filled circle, an
            unfinished run's an open one (it goes on).
        notes: run name -> a few words appended to its legend entry (e.g. its test accuracy).
        reference_label: what the dashed lines are, in the legend.
        title: the figure's title.

    Returns:
        A 0-100 % accuracy axis (``figure.axes[0]``) with chance (12.5 %) dotted; runs without any validation
        accuracy yet are named in the legend as ``<run>: no accuracy yet``. When some runs have epochs with a
        validation loss but no accuracy (MLCL's contrastive pre-training), a second, lower axis draws that loss
        over those epochs in the runs' colours, so that their progress shows before their first accuracy. Up to
        ``LEGEND_INSIDE`` runs the legend sits in the lower right; a larger grid gets 20 colours and markers that
        repeat every 20 runs, and its legend in columns below the axes (the figure grows with it).
    """
    references, finished, notes = references or {}, finished or {}, notes or {}
    many = len(curves) > LEGEND_INSIDE
    columns = 2 if many else 1
    legend_rows = -(-(len(curves) + 2) // columns)
    colours = ([plt.get_cmap("tab20")(i) for i in range(20)] if many
               else plt.rcParams["axes.prop_cycle"].by_key()["color"])
    lines = []  # (name, colour, x of the epochs with an accuracy, accuracies in percent)
    losses = []  # (name, colour, x of the epochs with a validation loss but no accuracy, those losses)
    right = 1.0
    for index, (name, history) in enumerate(curves.items()):
        xs = history_x(history)[0] if history else np.array([])
        accuracy = np.asarray(history.get("val_accuracy", np.full(len(xs), np.nan)), float) * 100
        loss = np.asarray(history.get("val_loss", np.full(len(xs), np.nan)), float)
        if xs.size:
            right = max(right, float(xs.max()) + 1)
        ok = ~np.isnan(accuracy)
        colour = colours[index % len(colours)]
        lines.append((name, colour, xs[ok], accuracy[ok]))
        before = ~ok & np.isfinite(loss)
        if before.any():
            losses.append((name, colour, xs[before], loss[before]))
    height = 4.2 + (0.16 * legend_rows if many else 0)
    if losses:
        fig, (ax, ax_loss) = plt.subplots(2, 1, sharex=True, figsize=(8 if not many else 11, height + 1.9),
                                          gridspec_kw={"height_ratios": [4.2, 1.9]})
    else:
        fig, ax = plt.subplots(figsize=(8 if not many else 11, height))
        ax_loss = None
    for index, (name, colour, xs, accuracy) in enumerate(lines):
        # beyond 20 runs the colours repeat: a marker tells the rounds of 20 apart
        marker = (None, "^", "s", "x", "+")[(index // 20) % 5] if many else None
        if not xs.size:
            note = f", {notes[name]}" if name in notes else ""
            below = " (loss below)" if any(name == other for other, *_ in losses) else ""
            ax.plot([], [], color=colour, label=f"{_legend_name(name)}: no accuracy yet{below}{note}")
            continue
        done = finished.get(name, False)
        label = (f"{_legend_name(name)}: best {accuracy.max():.1f} %, last {accuracy[-1]:.1f} % "
                 f"at epoch {int(xs[-1]) + 1}")
        label += f", {notes[name]}" if name in notes else ""
        ax.plot(xs, accuracy, color=colour, lw=1.3, label=label, marker=marker, markevery=max(1, len(xs) // 8),
                ms=4)
        ax.plot(xs[-1], accuracy[-1], "o", color=colour, ms=5, mfc=colour if done else "white")
    shared = _draw_references(ax, lines, references, right)
    ax.axhline(CHANCE_PERCENT, color="grey", ls=":", lw=1, label="chance (12.5 %)")
    if any(name in references for name, _, xs, _ in lines if xs.size):
        where = "same colour; dark grey: shared by several runs" if shared else "same colour"
        ax.plot([], [], color="grey", ls="--", lw=0.9, label=f"dashed: {reference_label} ({where})")
    ax.set_xlim(0, right)
    ax.set_ylim(0, 100)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3)
    bottom = ax
    if ax_loss is not None:
        for name, colour, xs, loss in losses:
            ax_loss.plot(xs, loss, color=colour, lw=1.3, marker="." if xs.size < 30 else None, ms=4)
        if all((loss > 0).all() for *_, loss in losses):
            # a diverging run (a loss of 1e6 beside others near 6) must not flatten the others into a line at zero
            ax_loss.set_yscale("log")
            plain = FuncFormatter(lambda value, _: f"{value:g}")  # 6, 7, 8 rather than 6 x 10^0
            ax_loss.yaxis.set_major_formatter(plain)
            values = np.concatenate([loss for *_, loss in losses])
            if values.max() < 10 * values.min():  # within one decade only the minor ticks carry numbers
                ax_loss.yaxis.set_minor_formatter(plain)
        ax_loss.set_ylabel("val loss", fontsize=9)
        ax_loss.set_title("epochs without an accuracy (pre-training): validation loss, lower is better",
                          loc="right", fontsize=7, color="0.3")
        ax_loss.grid(alpha=0.3)
        bottom = ax_loss
    bottom.set_xlabel("epoch (all stages)")
    if many:
        # below the lowest axis (under the accuracy axis it would cover the loss axis), and owned by it, so that
        # the layout makes room for it there
        handles, labels = ax.get_legend_handles_labels()
        bottom.legend(handles, labels, fontsize=6.5, loc="upper center",
                      bbox_to_anchor=(0.5, -0.14 if ax_loss is None else -0.32), ncol=columns, frameon=False)
    else:
        # below the curves, which rise towards the top: the lower right is where they are not
        ax.legend(fontsize=7, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
