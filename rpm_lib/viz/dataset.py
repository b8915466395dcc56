"""Dataset exploration: how often each rule occurs per configuration, where the correct answer sits, and
per-configuration summaries, with their figures."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rpm_lib import rules


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
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 2.5 problems
    ax.set_xticks(range(8))
    if counts:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: inside it hid bars
    ax.set_title(title or "answer positions")
    fig.tight_layout()
    return fig


def indices_by_configuration(dataset: Any) -> dict[str, np.ndarray]:
    """``{configuration folder name: int64 dataset indices}`` for the configurations present, in dataset order."""
    names = dataset.labels.group_names
    groups = np.asarray(dataset.configuration_indices)
    return {names[int(c)]: np.flatnonzero(groups == c) for c in dict.fromkeys(groups.tolist())}


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
