"""Figures and tables for the notebooks: accuracies, confusions, rule predictions, curves, ablations.

Every ``plot_*`` function takes plain arrays / mappings, returns a ``matplotlib.figure.Figure`` with a fixed
size (nbval compares the figure's ``text/plain`` repr, ``<Figure size WxH with N Axes>``) and never calls
``plt.show()``; the notebooks hand it to :func:`show`, which saves a PNG into ``output_dir`` (when given),
displays it and closes it. The numbers behind each figure come from small pure functions
(``confusion_matrix``, ``rule_frequencies``, ``answer_position_counts``, …) that the
tests check directly.

Accuracies are in percent; rule vectors are ``(N, R)`` arrays with rules as columns (named by
``RuleEncoding.slot_names()`` from :mod:`rpm_lib.rule_encodings`).
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from rpm_lib import rules
from rpm_lib.results import markdown_table

#: Chance level of an 8-way answer choice, percent.
CHANCE_PERCENT: float = 100.0 / 8

# ----------------------------------------------------------------------------------------------
# Output helpers
# ----------------------------------------------------------------------------------------------


def save_figure(fig: Figure, output_dir: str | Path | None, name: str, dpi: int = 100) -> Path | None:
    """Write ``fig`` as ``<output_dir>/<name>.png`` (folder created); nothing when ``output_dir`` is empty."""
    if not output_dir:
        return None
    path = Path(output_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def show(fig: Figure, output_dir: str | Path | None = None, name: str | None = None) -> None:
    """Save (when ``output_dir`` and ``name`` are given), display inline and close ``fig``.

    Closing matters: the inline backend would otherwise display a pyplot-managed figure a second time.
    Returns nothing, so a notebook cell ending with ``show(...)`` prints no path.
    """
    from IPython.display import display

    if name:
        save_figure(fig, output_dir, name)
    display(fig)
    plt.close(fig)


def save_table(header: Sequence[str], rows: Iterable[Sequence[Any]], output_dir: str | Path | None,
               name: str) -> tuple[Path, Path] | None:
    """Write ``<name>.csv`` and ``<name>.md`` into ``output_dir`` (nothing when it is empty)."""
    if not output_dir:
        return None
    rows = [list(r) for r in rows]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    md_path.write_text(markdown_table(header, rows))
    return csv_path, md_path


def project_root(start: str | Path | None = None) -> Path:
    """The first folder at or above ``start`` (default: the working directory) holding ``pyproject.toml``.

    Notebooks opened from ``notebooks/`` run with that folder as working directory; resolving relative paths
    against the project root makes ``data/…`` and ``runs/…`` mean the same thing there, under papermill and
    in ``rpm-batch``. Falls back to ``start`` itself when no ancestor has ``pyproject.toml``.
    """
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return here


def resolve_path(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` if absolute, else ``project_root(root) / path``."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else project_root(root) / p


def format_percent(value: float | None, digits: int = 1) -> str:
    """``87.25 -> "87.2"``; ``None``/NaN -> ``"–"``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


# ----------------------------------------------------------------------------------------------
# Numbers behind the figures
# ----------------------------------------------------------------------------------------------


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


#: Compact relation names for the 19 (relation, attribute) columns of the rule-frequency heatmap, whose
#: columns are rule kinds regardless of component, not the slots of an encoding.
_SHORT_RELATION = {"Constant": "Const", "Progression": "Prog", "Arithmetic": "Arith", "Distribute_Three": "Dist3"}


def rule_frequencies(meta_matrices: np.ndarray,
                     configurations: Sequence[str]) -> tuple[np.ndarray, list[str], list[str]]:
    """Fraction of problems per configuration in which each (relation, attribute) rule occurs.

    Args:
        meta_matrices: ``(N, 8, 9)`` 0/1 ``meta_matrix`` of each problem.
        configurations: ``N`` configuration folder names.

    Returns:
        ``(freq, row_names, col_names)``: ``freq`` float64 ``(C, 19)`` for the ``C`` configurations present
        (in ``rules.CONFIGURATIONS`` order, rows named by short name), columns ``rules.RAVEN_RULE_PAIRS``
        (``"Prog Size"``); a rule counts once per problem whichever component carries it.
    """
    meta_matrices = np.asarray(meta_matrices)
    if meta_matrices.ndim != 3 or len(meta_matrices) != len(configurations):
        raise ValueError(f"rule_frequencies: need (N, 8, 9) matrices and N configurations, got "
                         f"{meta_matrices.shape} and {len(configurations)}")
    sparse = rules.raven_sparse_batch(meta_matrices, "sparse38")
    pairs = len(rules.RAVEN_RULE_PAIRS)
    present = np.maximum(sparse[:, :pairs], sparse[:, pairs:])  # (N, 19): either component
    folders = [rules.resolve_configuration(c) for c in configurations]
    rows = [c for c in rules.CONFIGURATIONS if c in set(folders)]
    freq = np.zeros((len(rows), pairs))
    folders_arr = np.asarray(folders)
    for i, c in enumerate(rows):
        freq[i] = present[folders_arr == c].mean(0)
    cols = [f"{_SHORT_RELATION[r]} {a}" for r, a in rules.RAVEN_RULE_PAIRS]
    return freq, [rules.SHORT_NAMES[c] for c in rows], cols


def answer_position_counts(targets: Sequence[int] | np.ndarray, num_choices: int = 8) -> np.ndarray:
    """int64 ``(num_choices,)``: how often each choice index is the answer."""
    targets = np.asarray(targets, dtype=np.int64)
    if targets.size and (targets.min() < 0 or targets.max() >= num_choices):
        raise ValueError(f"answer_position_counts: targets outside 0..{num_choices - 1}")
    return np.bincount(targets, minlength=num_choices)


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------


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
    ax.set_xticks(x, names, rotation=0, fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
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


def plot_rule_heatmap(true: np.ndarray, predicted: np.ndarray, names: Sequence[str], max_problems: int = 40,
                      only_used: bool = True, title: str | None = None) -> Figure:
    """True rule vectors beside predicted probabilities for the first ``max_problems`` problems.

    Args:
        true: ``(N, R)`` 0/1 labels.
        predicted: ``(N, R)`` probabilities in [0, 1].
        names: ``R`` slot names (``RuleEncoding.slot_names``).
        only_used: drop slots that are 0 in ``true`` and < 0.5 in ``predicted`` for all shown problems.
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
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharey=True)
    for ax, data, label in ((axes[0], true, "true rules"), (axes[1], predicted, "predicted probability")):
        im = ax.imshow(data[:, cols], aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(len(cols)), [names[c] for c in cols], rotation=90, fontsize=6)
        ax.set_title(label, fontsize=9)
    axes[0].set_ylabel("problem")
    fig.colorbar(im, ax=axes, fraction=0.03)
    if title:
        fig.suptitle(title)
    return fig


def plot_per_rule_f1(scores: Mapping[str, np.ndarray], names: Sequence[str], min_support: int = 1,
                     title: str | None = None) -> Figure:
    """Horizontal bars of per-rule F1 (from ``rpm_lib.training.metrics.per_rule_scores``) for rules with ``support >= min_support``."""
    f1, support = np.asarray(scores["f1"]), np.asarray(scores["support"])
    keep = np.flatnonzero(support >= min_support)
    fig, ax = plt.subplots(figsize=(6, max(2.5, 0.18 * len(keep) + 1)))
    y = np.arange(len(keep))
    ax.barh(y, np.nan_to_num(f1[keep]), color="tab:blue")
    ax.set_yticks(y, [f"{names[i]} (n={support[i]})" for i in keep], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("F1")
    ax.set_title(title or "per-rule F1")
    fig.tight_layout()
    return fig


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
    (e.g. ``val_accuracy`` during MLCL pre-training) are skipped.
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
                ax.plot(xs[ok], values[ok], marker="." if ok.sum() < 30 else None, label=name)
                plotted += 1
        for x0, stage in boundaries if len(boundaries) > 1 else []:
            ax.axvline(x0, color="grey", ls="--", lw=0.8)
            ax.annotate(stage, (x0, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if plotted:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no '{key}' values", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_rule_frequencies(freq: np.ndarray, row_names: Sequence[str], col_names: Sequence[str],
                          title: str | None = None) -> Figure:
    """Heatmap of ``rule_frequencies``: configurations x (relation, attribute), cells = fraction of problems."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    im = ax.imshow(freq, aspect="auto", cmap="magma_r", vmin=0, vmax=1)
    ax.set_xticks(range(len(col_names)), col_names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(row_names)), row_names, fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03, label="fraction of problems")
    ax.set_title(title or "rules per configuration")
    fig.tight_layout()
    return fig


def plot_answer_positions(counts: Mapping[str, np.ndarray], title: str | None = None) -> Figure:
    """Stacked bars: how often each choice index (0..7) is the answer, one colour per configuration."""
    fig, ax = plt.subplots(figsize=(6, 3))
    bottom = None
    for name, c in counts.items():
        c = np.asarray(c)
        ax.bar(np.arange(len(c)), c, bottom=bottom, label=name)
        bottom = c if bottom is None else bottom + c
    ax.set_xlabel("answer index")
    ax.set_ylabel("problems")
    ax.set_xticks(range(8))
    if counts:
        ax.legend(fontsize=6, ncol=2)
    ax.set_title(title or "answer positions")
    fig.tight_layout()
    return fig


def plot_ablation(series: Mapping[str, Sequence[Any]], parameter: str, reference: Mapping[str, float] | None = None,
                  log_x: bool = False, title: str | None = None) -> Figure:
    """Accuracy vs a parameter (``results.ablation_series``: points with ``value, mean, std``), error bars = std.

    ``reference`` adds horizontal markers (e.g. the paper's number at one setting) keyed by series name prefix.
    """
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in series.items():
        xs = [p.value for p in points]
        ys = [p.mean for p in points]
        es = [0.0 if math.isnan(p.std) else p.std for p in points]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    for name, value in (reference or {}).items():
        ax.axhline(value, ls=":", lw=1, color="grey")
        ax.annotate(name, (0, value), xycoords=("axes fraction", "data"), fontsize=6, va="bottom")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(parameter)
    ax.set_ylabel("average test accuracy (%)")
    if series:
        ax.legend(fontsize=7)
    else:
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
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 3.5))
    ours = [r.average for r in rows]
    errs = [0.0 if math.isnan(r.std) else r.std for r in rows]
    ax.bar(x - 0.2, ours, 0.4, yerr=errs, capsize=3, label="ours")
    ax.bar(x + 0.2, [r.paper.average if r.paper else np.nan for r in rows], 0.4, label="paper", alpha=0.6)
    ax.axhline(CHANCE_PERCENT, color="grey", ls="--", lw=1, label="chance")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("average test accuracy (%)")
    ax.legend(fontsize=8)
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
    from rpm_lib.claims import row_key

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


# ----------------------------------------------------------------------------------------------
# RPMs from datasets, solved matrices, augmentation panels
# ----------------------------------------------------------------------------------------------


def indices_by_configuration(dataset: Any) -> dict[str, np.ndarray]:
    """``{configuration folder name: int64 dataset indices}`` for the configurations present, in dataset order."""
    names = dataset.labels.group_names
    groups = np.asarray(dataset.configuration_indices)
    return {names[int(c)]: np.flatnonzero(groups == c) for c in dict.fromkeys(groups.tolist())}


def load_or_generate(data_root: str, split: str, *, sample_root: str = "data/notebook-sample",
                     sample_per_config: int = 20, sample_seed: int = 0, sample_mode: str = "balanced",
                     configurations: Sequence[str] | None = None, image_size: int = 160,
                     answer_order: str = "none") -> Any:
    """A ``RavenDataset`` of ``data_root``; when ``data_root`` is empty, of a small generated sample set.

    The sample set (``sample_per_config`` problems per configuration, split by ``k % 10``) is written to
    ``sample_root`` with ``rpm_lib.generator.writer.write_dataset`` — resumable and deterministic (problem
    ``k`` depends only on the seed, the configuration and ``k``), so a second call reuses the files. Relative
    paths are relative to the project root (``resolve_path``). ``answer_order="none"`` keeps file order.
    """
    from rpm_lib.data import RavenDataset

    if data_root:
        root = resolve_path(data_root)
    else:
        from rpm_lib.generator.writer import write_dataset

        root = resolve_path(sample_root)
        write_dataset(root, list(rules.CONFIGURATIONS), count=sample_per_config, seed=sample_seed,
                      mode=sample_mode, write_xml=False, progress=False)
    return RavenDataset(root, split, configurations=configurations or None, image_size=image_size,
                        answer_order=answer_order)


def dataset_summary(dataset: Any) -> tuple[list[str], list[list[Any]]]:
    """Per-configuration statistics of a RAVEN dataset: header and rows for ``save_table`` / display.

    Columns: configuration, problems, mean rules per problem (rules as ``describe_raven_rules`` lists them),
    the most frequent rule, and how often the answer (file order) sits at each choice index 0..7.
    """
    labels = dataset.labels
    header = ["configuration", "problems", "rules / problem", "most frequent rule", *(f"answer {k}" for k in range(8))]
    out = []
    for configuration, idx in indices_by_configuration(dataset).items():
        n_rules = [len(rules.raven_rules_from_meta_matrix(labels.meta[i])) for i in idx]
        freq, _, cols = rule_frequencies(labels.meta[idx], [configuration] * len(idx))
        top = int(np.argmax(freq[0]))
        out.append([rules.SHORT_NAMES[configuration], len(idx), f"{np.mean(n_rules):.2f}",
                    f"{cols[top]} ({100 * freq[0, top]:.0f}%)", *answer_position_counts(labels.targets[idx]).tolist()])
    return header, out


def dataset_rule_lines(dataset: Any, index: int) -> list[str]:
    """The rules of problem ``index`` of a ``RavenDataset`` in words (components named by configuration)."""
    labels = dataset.labels
    configuration = labels.group_names[int(labels.configurations[index])]
    return rules.describe_raven_rules(labels.meta[index], configuration)


def rpm_figure(dataset: Any, index: int, predicted: int | None = None, title: str | None = None,
               with_rules: bool = True) -> Figure:
    """``viz.plot_rpm`` of problem ``index`` of a RAVEN dataset: answer framed, rules in words.

    The title defaults to ``"<short configuration> · <source_id>"``. ``predicted`` is in the sample's answer
    order (``dataset[index]["target"]``'s order).
    """
    from rpm_lib import viz

    sample = dataset[index]
    configuration = dataset.labels.group_names[int(sample["configuration"])]
    if title is None:
        title = f"{rules.SHORT_NAMES.get(configuration, configuration)} · {sample['source_id']}"
    panels = sample["panels"].numpy()
    if panels.ndim == 4:  # several views: show the first
        panels = panels[0]
    return viz.plot_rpm(panels, target=int(sample["target"]), title=title, predicted=predicted,
                        rule_lines=dataset_rule_lines(dataset, index) if with_rules else None)


def rpm_gallery(dataset: Any, indices: Sequence[int], ncols: int = 2, title: str | None = None,
                predicted: Sequence[int] | None = None, with_rules: bool = True) -> Figure:
    """``viz.plot_gallery`` of several problems of a dataset (answer framed green, rules in words).

    ``predicted`` (one per index, in the samples' answer order) frames wrong choices red. ``with_rules``
    needs a RAVEN dataset (PGM rules are not described in words here).
    """
    from rpm_lib import viz

    if predicted is not None and len(predicted) != len(indices):
        raise ValueError(f"rpm_gallery: {len(predicted)} predictions for {len(indices)} problems")
    items = []
    for k, index in enumerate(indices):
        sample = dataset[int(index)]
        configuration = dataset.labels.group_names[int(sample["configuration"])]
        panels = sample["panels"].numpy()
        items.append({"panels": panels[0] if panels.ndim == 4 else panels, "target": int(sample["target"]),
                      "title": f"{rules.SHORT_NAMES.get(configuration, configuration)} · {sample['source_id']}",
                      "rule_lines": dataset_rule_lines(dataset, int(index)) if with_rules else None,
                      "predicted": None if predicted is None else int(predicted[k])})
    return viz.plot_gallery(items, ncols=ncols, title=title, panel_inches=(6.4, 4.8))


def solved_matrix(panels: np.ndarray, target: int, gap: int = 4, gap_value: int = 128) -> np.ndarray:
    """uint8 ``(3S + 2 gap, 3S + 2 gap)``: the 3x3 matrix completed with the correct choice.

    Panels are separated by ``gap`` px of grey ``gap_value`` so white panel borders stay visible.

    ``panels`` is uint8 ``(16, S, S)`` (8 context panels, then 8 choices).
    """
    panels = np.asarray(panels)
    if panels.ndim != 3 or panels.shape[0] != 16:
        raise ValueError(f"solved_matrix: panels must be (16, S, S), got {panels.shape}")
    if not 0 <= int(target) < 8:
        raise ValueError(f"solved_matrix: target must be in 0..7, got {target}")
    s = panels.shape[1]
    out = np.full((3 * s + 2 * gap, 3 * s + 2 * gap), gap_value, dtype=np.uint8)
    cells = list(panels[:8]) + [panels[8 + int(target)]]
    for k, cell in enumerate(cells):
        r, c = divmod(k, 3)
        out[r * (s + gap): r * (s + gap) + s, c * (s + gap): c * (s + gap) + s] = cell
    return out


def describe_applied(applied: Sequence[Any]) -> str:
    """Caption of ``RpmAugment.last_applied``: ``"hflip + rotate 37°"``; ``"identity"`` when empty."""
    parts = []
    for t in applied:
        if t.name == "rotate":
            parts.append(f"rotate {t.params['angle']:.0f}°")
        elif t.name == "rot90":
            parts.append(f"rot90 ×{t.params.get('factor', '?')}")
        elif t.name.startswith("roll"):
            parts.append(f"{t.name} ({t.params.get('dy', 0)}, {t.params.get('dx', 0)})")
        else:
            parts.append(t.name)
    return " + ".join(parts) or "identity"


def single_transform_examples(panels: np.ndarray, target: int, preserve_position: bool,
                              names: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    """``{caption: solved matrix}``: the original, then the RPM under each single transform in ``names``.

    Every transform uses ``augment.single_transform(name, seed)``. A grid-shuffle / roll on an RPM with a
    position rule (``preserve_position``) is not applied (it would break the rule); its caption says so.
    """
    from rpm_lib import augment

    out = {"original": solved_matrix(panels, target)}
    for name in names:
        aug = augment.single_transform(name, seed=seed)
        result = aug(np.ascontiguousarray(panels), preserve_position=preserve_position)
        caption = describe_applied(aug.last_applied) if aug.last_applied else f"{name}: skipped (position rule)"
        out[caption if caption not in out else f"{caption} [{name}]"] = solved_matrix(result, target)
    return out


def recipe_examples(panels: np.ndarray, target: int, preserve_position: bool, recipe: str, count: int,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """``{caption: solved matrix}`` of ``count`` draws of ``RpmAugment(recipe, seed, p=1)`` (captions numbered)."""
    from rpm_lib import augment

    aug = augment.RpmAugment(recipe, seed=seed, p=1.0)
    out = {}
    for k in range(count):
        result = aug(np.ascontiguousarray(panels), preserve_position=preserve_position)
        out[f"{k + 1}. {describe_applied(aug.last_applied)}"] = solved_matrix(result, target)
    return out


def plot_matrices(images: Mapping[str, np.ndarray], ncols: int = 4, title: str | None = None,
                  cell_inches: float = 2.4) -> Figure:
    """Grid of grey images (e.g. ``solved_matrix`` outputs) with their captions as titles."""
    if not images:
        raise ValueError("plot_matrices needs at least one image")
    n = len(images)
    ncols = max(1, min(ncols, n))
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell_inches * ncols, cell_inches * nrows + 0.4), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (caption, image) in zip(axes.ravel(), images.items()):
        ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(caption, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Rule vectors in words
# ----------------------------------------------------------------------------------------------


def compare_rules(true_rules: Sequence[str], predicted_rules: Sequence[str]) -> dict[str, list[str]]:
    """``{"correct", "missing", "extra"}``: rules in both, only in ``true_rules``, only in ``predicted_rules``."""
    predicted_set, true_set = set(predicted_rules), set(true_rules)
    return {"correct": [r for r in true_rules if r in predicted_set],
            "missing": [r for r in true_rules if r not in predicted_set],
            "extra": [r for r in predicted_rules if r not in true_set]}


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float64."""
    logits = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(logits)
    pos = logits >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-logits[pos]))
    e = np.exp(logits[~pos])
    out[~pos] = e / (1.0 + e)
    return out
