"""Figures of Raven's Progressive Matrices: one problem (``plot_rpm``) or a gallery (``plot_gallery``).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state), so they work headless; save
them with ``fig.savefig(path)``.

Layout of one RPM: the 3x3 context matrix with a "?" in the missing bottom-right cell, the 8 choices
below it (two rows of four, labelled 0..7 = the ``target`` index), the correct choice framed green, a
wrong prediction framed red, and the rules written in words in a column to the right.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure, SubFigure
from matplotlib.patches import Rectangle

from rpm_lib import rules

CORRECT_COLOR = "#1a9850"
WRONG_COLOR = "#d73027"


# ---------------------------------------------------------------------------------------------------
# Rule text
# ---------------------------------------------------------------------------------------------------


def describe_rules(meta_matrix: np.ndarray, configuration: str | None = None) -> list[str]:
    """One readable line per rule of an (8, 9) ``meta_matrix``, e.g. ``"Left: Progression on Size"``."""
    return rules.describe_raven_rules(np.asarray(meta_matrix), configuration)


def describe_problem_rules(problem: Any) -> list[str]:
    """Readable rules of a generator ``Problem`` (with parameters), e.g. ``"Grid: Progression +1 on Size"``.

    Arithmetic is written as "add" / "subtract" ("union" / "difference" on Position).
    """
    from rpm_lib.generator.constants import CONFIG_SPECS

    names = [name for name, _layout in CONFIG_SPECS[problem.configuration].components]
    lines = []
    for rule in problem.rules:
        relation = rule.name
        if rule.name == "Progression" and rule.value:
            relation = f"Progression {rule.value:+d}"
        elif rule.name == "Arithmetic" and rule.value:
            if rule.attr == "Position":
                relation = "Arithmetic (union)" if rule.value > 0 else "Arithmetic (difference)"
            else:
                relation = "Arithmetic (add)" if rule.value > 0 else "Arithmetic (subtract)"
        lines.append(f"{names[rule.component]}: {relation} on {rule.attr}")
    return lines


# ---------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------


def _check_panels(panels: np.ndarray) -> np.ndarray:
    array = np.asarray(panels)
    if array.ndim != 3 or array.shape[0] != 16 or array.shape[1] != array.shape[2]:
        raise ValueError(f"panels must be (16, S, S) (8 context + 8 choices), got shape {array.shape}")
    return array


def _frame(ax, color: str, width: float = 4.0) -> None:
    # Drawn just outside the axes: shapes in corner slots touch the panel border and must stay visible.
    pad = 0.04
    ax.add_patch(Rectangle((-pad, -pad), 1 + 2 * pad, 1 + 2 * pad, transform=ax.transAxes, fill=False,
                           edgecolor=color, linewidth=width, clip_on=False))


def _show_panel(ax, panel: np.ndarray, label: str | None = None) -> None:
    # Area-like filtering when shrinking: a 1 px divider (L-R, U-D) stays visible in every panel.
    ax.imshow(panel, cmap="gray", vmin=0, vmax=255, interpolation="antialiased")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor("#888888")
        spine.set_linewidth(0.8)
    if label is not None:
        ax.set_xlabel(label, fontsize=8, labelpad=2)


def _draw_rpm(
    container: Figure | SubFigure,
    panels: np.ndarray,
    target: int | None,
    title: str | None,
    rule_lines: Sequence[str] | None,
    predicted: int | None,
    rules_heading: str = "Rules",
) -> None:
    panels = _check_panels(panels)
    for name, value in (("target", target), ("predicted", predicted)):
        if value is not None and not 0 <= int(value) < 8:
            raise ValueError(f"{name} must be in 0..7, got {value}")
    has_text = bool(rule_lines)
    outer = container.add_gridspec(1, 2 if has_text else 1, width_ratios=[3.3, 2.7] if has_text else None, wspace=0.05)
    left = outer[0, 0].subgridspec(2, 1, height_ratios=[3, 2.1], hspace=0.12)
    context = left[0].subgridspec(3, 3, wspace=0.04, hspace=0.04)
    choices = left[1].subgridspec(2, 4, wspace=0.06, hspace=0.25)
    blank = np.full_like(panels[0], 255)
    for cell in range(9):
        ax = container.add_subplot(context[cell // 3, cell % 3])
        if cell < 8:
            _show_panel(ax, panels[cell])
        else:
            _show_panel(ax, blank)
            ax.text(0.5, 0.5, "?", transform=ax.transAxes, ha="center", va="center", fontsize=28, color="#444444")
    for choice in range(8):
        ax = container.add_subplot(choices[choice // 4, choice % 4])
        _show_panel(ax, panels[8 + choice], label=str(choice))
        if target is not None and choice == int(target):
            _frame(ax, CORRECT_COLOR)
        elif predicted is not None and choice == int(predicted):
            _frame(ax, WRONG_COLOR)
    if has_text:
        ax = container.add_subplot(outer[0, 1])
        ax.axis("off")
        text = f"{rules_heading}:\n" + "\n".join(f"- {line}" for line in rule_lines)
        if target is not None:
            text += f"\n\nanswer: {int(target)}"
        if predicted is not None:
            text += f"\npredicted: {int(predicted)}" + (" (correct)" if predicted == target else " (wrong)")
        ax.text(0.02, 0.98, text, transform=ax.transAxes, ha="left", va="top", fontsize=8, wrap=True,
                family="monospace")
    if title:
        container.suptitle(title, fontsize=11)


def plot_rpm(
    panels: np.ndarray,
    target: int | None = None,
    title: str | None = None,
    rule_lines: Sequence[str] | None = None,
    predicted: int | None = None,
    figsize: tuple[float, float] | None = None,
    rules_heading: str = "Rules",
) -> Figure:
    """Figure of one RPM.

    Args:
        panels: uint8 ``(16, S, S)``: 8 context panels (row-major), then the 8 choices.
        target: index 0..7 of the correct choice (framed green); None = not marked.
        title: figure title (``fig._suptitle``).
        rule_lines: rules in words, written beside the matrix (one per line); None/empty = no text column.
        predicted: a model's choice 0..7; framed red when it differs from ``target``.
        figsize: inches; default fits the layout.
        rules_heading: the line above ``rule_lines``.
    Returns:
        The ``Figure``: 17 image axes (9 context incl. the "?" cell, then 8 choices) + 1 text axis if any rules.
    """
    if figsize is None:
        figsize = (7.4, 6.2) if rule_lines else (4.4, 6.2)
    fig = Figure(figsize=figsize, layout=None)
    _draw_rpm(fig, panels, target, title, rule_lines, predicted, rules_heading)
    return fig


@dataclass
class GalleryItem:
    """One RPM of a gallery (the arguments of ``plot_rpm``)."""

    panels: np.ndarray
    target: int | None = None
    title: str | None = None
    rule_lines: Sequence[str] | None = None
    predicted: int | None = None


def _as_item(item: GalleryItem | Mapping[str, Any]) -> GalleryItem:
    if isinstance(item, GalleryItem):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - {"panels", "target", "title", "rule_lines", "predicted"}
        if unknown or "panels" not in item:
            raise ValueError(f"gallery item needs 'panels' and only plot_rpm's arguments; got keys {sorted(item)}")
        return GalleryItem(**item)
    raise TypeError(f"gallery items must be GalleryItem or dict, got {type(item).__name__}")


def plot_gallery(
    items: Iterable[GalleryItem | Mapping[str, Any]],
    ncols: int = 2,
    title: str | None = None,
    panel_inches: tuple[float, float] = (7.4, 6.2),
) -> Figure:
    """Several RPMs in one figure (e.g. one per configuration), ``ncols`` per row.

    Each item is a ``GalleryItem`` or a dict of ``plot_rpm`` arguments. Every RPM is drawn in its own
    ``SubFigure`` (``fig.subfigs``) whose title is the item's title.
    """
    entries = [_as_item(item) for item in items]
    if not entries:
        raise ValueError("plot_gallery needs at least one item")
    ncols = max(1, min(ncols, len(entries)))
    nrows = (len(entries) + ncols - 1) // ncols
    fig = Figure(figsize=(panel_inches[0] * ncols, panel_inches[1] * nrows))
    subfigures = np.atleast_1d(fig.subfigures(nrows, ncols, wspace=0.02, hspace=0.02)).ravel()
    for subfigure, entry in zip(subfigures, entries):
        _draw_rpm(subfigure, entry.panels, entry.target, entry.title, entry.rule_lines, entry.predicted)
    for subfigure in subfigures[len(entries):]:
        subfigure.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=14, y=1.0, va="bottom")  # above the subfigures; save with bbox_inches="tight"
    return fig


def dataset_rule_lines(dataset: Any, index: int) -> list[str]:
    """The rules of problem ``index`` of a ``RavenDataset`` in words (components named by configuration)."""
    labels = dataset.labels
    configuration = labels.group_names[int(labels.configurations[index])]
    return rules.describe_raven_rules(labels.meta[index], configuration)


def rpm_figure(dataset: Any, index: int, predicted: int | None = None, title: str | None = None,
               with_rules: bool = True, rule_lines: Sequence[str] | None = None,
               rules_heading: str = "Rules") -> Figure:
    """``viz.plot_rpm`` of problem ``index`` of a RAVEN dataset: answer framed, rules in words.

    The title defaults to ``"<short configuration> · <source_id>"``. ``predicted`` is in the sample's answer
    order (``dataset[index]["target"]``'s order). ``rule_lines`` replaces the problem's own rules in the text
    column (e.g. true vs predicted rules, under ``rules_heading``).
    """
    sample = dataset[index]
    configuration = dataset.labels.group_names[int(sample["configuration"])]
    if title is None:
        title = f"{rules.SHORT_NAMES.get(configuration, configuration)} · {sample['source_id']}"
    panels = sample["panels"].numpy()
    if panels.ndim == 4:  # several views: show the first
        panels = panels[0]
    if rule_lines is None and with_rules:
        rule_lines = dataset_rule_lines(dataset, index)
    return plot_rpm(panels, target=int(sample["target"]), title=title, predicted=predicted, rule_lines=rule_lines,
                    rules_heading=rules_heading)


def rpm_gallery(dataset: Any, indices: Sequence[int], ncols: int = 2, title: str | None = None,
                predicted: Sequence[int] | None = None, with_rules: bool = True) -> Figure:
    """``viz.plot_gallery`` of several problems of a dataset (answer framed green, rules in words).

    ``predicted`` (one per index, in the samples' answer order) frames wrong choices red. ``with_rules``
    needs a RAVEN dataset (PGM rules are not described in words here).
    """
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
    return plot_gallery(items, ncols=ncols, title=title, panel_inches=(6.4, 4.8))


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


def plot_matrices(images: Mapping[str, np.ndarray], ncols: int = 4, title: str | None = None,
                  cell_inches: float = 2.4) -> Figure:
    """Grid of grey images (e.g. ``solved_matrix`` outputs) with their captions as titles."""
    if not images:
        raise ValueError("plot_matrices needs at least one image")
    n = len(images)
    ncols = max(1, min(ncols, n))
    nrows = (n + ncols - 1) // ncols
    # 0.3 in per row for its captions, so a second row's captions never touch the images above.
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell_inches * ncols, (cell_inches + 0.3) * nrows + 0.4),
                             squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (caption, image) in zip(axes.ravel(), images.items()):
        ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="antialiased")
        ax.set_title(caption, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
