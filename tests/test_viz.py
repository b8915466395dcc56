"""Figures: checked on the returned Figure's structure, not on PNG bytes."""
from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from rpm_lib import viz

RNG = np.random.default_rng(0)
PANELS = RNG.integers(0, 256, size=(16, 20, 20), dtype=np.uint8)


def _frames(ax) -> list[str]:
    return [p.get_edgecolor() for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]


def test_plot_rpm_layout_answer_and_prediction_frames():
    fig = viz.plot_rpm(PANELS, target=2, title="center_single #0", rule_lines=["Grid: Constant on Type"], predicted=5)
    assert len(fig.axes) == 9 + 8 + 1
    assert fig._suptitle.get_text() == "center_single #0"
    context, choices, text_ax = fig.axes[:9], fig.axes[9:17], fig.axes[17]
    assert np.array_equal(context[4].images[0].get_array(), PANELS[4])
    assert any(t.get_text() == "?" for t in context[8].texts)
    assert np.array_equal(choices[3].images[0].get_array(), PANELS[11])
    green = tuple(np.round(to_rgba(viz.CORRECT_COLOR), 6))
    red = tuple(np.round(to_rgba(viz.WRONG_COLOR), 6))
    framed = {i: [tuple(np.round(c, 6)) for c in _frames(ax)] for i, ax in enumerate(choices)}
    assert framed[2] == [green] and framed[5] == [red]
    assert all(not frames for i, frames in framed.items() if i not in (2, 5))
    rules_text = text_ax.texts[0].get_text()
    assert "Grid: Constant on Type" in rules_text and "predicted: 5 (wrong)" in rules_text


def test_plot_rpm_without_rules_or_marks():
    fig = viz.plot_rpm(PANELS)
    assert len(fig.axes) == 17
    assert fig._suptitle is None
    assert all(not _frames(ax) for ax in fig.axes)


def test_correct_prediction_is_not_framed_red():
    fig = viz.plot_rpm(PANELS, target=1, predicted=1, rule_lines=["x"])
    assert sum(len(_frames(ax)) for ax in fig.axes) == 1


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match=r"\(16, S, S\)"):
        viz.plot_rpm(PANELS[:9])
    with pytest.raises(ValueError, match="target"):
        viz.plot_rpm(PANELS, target=8)
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_gallery([])
    with pytest.raises(ValueError, match="panels"):
        viz.plot_gallery([{"image": PANELS}])


def test_gallery_has_one_subfigure_per_item_with_its_title():
    items = [{"panels": PANELS, "target": i, "title": f"config {i}", "rule_lines": [f"rule {i}"]} for i in range(3)]
    fig = viz.plot_gallery(items, ncols=2, title="gallery")
    assert len(fig.subfigs) == 4  # 2 x 2 grid, the last one hidden
    assert [sf._suptitle.get_text() for sf in fig.subfigs[:3]] == ["config 0", "config 1", "config 2"]
    assert not fig.subfigs[3].get_visible()
    assert len(fig.axes) == 3 * 18
    assert fig._suptitle.get_text() == "gallery"


def test_rule_text_from_meta_matrix_and_from_a_problem():
    matrix = np.zeros((8, 9), np.uint8)
    matrix[0, [0, 4, 5]] = 1
    matrix[1, [1, 6]] = 1
    matrix[2, [2, 7]] = 1
    matrix[3, [3, 8]] = 1
    lines = viz.describe_rules(matrix, "center_single")
    assert lines[1] == "Grid: Progression on Type" and len(lines) == 4

    from rpm_lib.generator.problem import Problem, Rule

    problem = Problem("left_center_single_right_center_single", [], [], 0, [
        Rule(0, "Progression", "Size", -2), Rule(1, "Arithmetic", "Color", 1), Rule(1, "Arithmetic", "Position", -1)])
    assert viz.describe_problem_rules(problem) == [
        "Left: Progression -2 on Size", "Right: Arithmetic (add) on Color", "Right: Arithmetic (difference) on Position"]
