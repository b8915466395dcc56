"""The cheap test that lets ``has_hidden_lookalikes`` skip rendering must never skip a real look-alike."""
from __future__ import annotations

import numpy as np

from rpm_lib.generator import candidate_sets, lookalikes, render
from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.constants import COLOR_MAX_LEVEL, LAYOUTS, MESH_LAYOUT
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel


def test_every_entity_lies_inside_its_black_extent() -> None:
    """Exhaustive over shape layouts, slots, types, sizes and angles: every drawn pixel of an entity is inside
    the square ``_black_extent`` gives, so the union of those squares holds every black pixel."""
    for name, layout in LAYOUTS.items():
        if layout.lines:
            continue
        for slot, bbox in enumerate(layout.slots):
            for t in range(layout.type[0], layout.type[1] + 1):
                for z in range(layout.size[0], layout.size[1] + 1):
                    x0, y0, x1, y1 = lookalikes._black_extent(name, slot, t, z)
                    for a in range(8):
                        sprite = render.make_sprite(bbox, t, z, COLOR_MAX_LEVEL, a)
                        rows, cols = np.nonzero(sprite.opaque)
                        assert rows.size and y0 <= sprite.y0 + rows.min() and sprite.y0 + rows.max() <= y1, (name, t, z, a)
                        assert x0 <= sprite.x0 + cols.min() and sprite.x0 + cols.max() <= x1, (name, t, z, a)


def test_line_interiors_keep_every_pixel_but_the_ends() -> None:
    for slot, bbox in enumerate(LAYOUTS[MESH_LAYOUT].slots):
        rows, cols = np.divmod(render.line_pixels(bbox), 160)
        x0, y0, x1, y1 = lookalikes._line_interior(slot)
        inside = (cols >= x0) & (cols <= x1) & (rows >= y0) & (rows <= y1)
        assert inside.sum() >= 0.85 * inside.size  # only the ends (4 px each) are left out


def test_a_line_inside_a_black_circle_may_hide_and_one_outside_may_not() -> None:
    def panel(color: int, size: int, slots: list[int]) -> Panel:
        lines = ComponentPanel(MESH_LAYOUT, 0, slots, [Entity(6, 0, 0, 0) for _ in slots])
        return Panel([ComponentPanel("Center_Single", 0, [0], [Entity(5, size, color, 3)]), lines])

    assert lookalikes._line_may_hide(panel(COLOR_MAX_LEVEL, 5, [11]))       # radius 72 px swallows slot 11
    assert not lookalikes._line_may_hide(panel(COLOR_MAX_LEVEL, 0, [11]))   # radius 32 px does not
    assert not lookalikes._line_may_hide(panel(COLOR_MAX_LEVEL, 3, [0]))    # radius 56 px: the left edge is outside
    assert not lookalikes._line_may_hide(panel(4, 5, [11]))                 # grey: nothing hides


def test_the_prefilter_changes_no_decision_on_generated_mesh_problems(monkeypatch) -> None:
    """Every candidate set of 700 Mesh problems: the decision with the prefilter equals the full rendering check."""
    seen = []
    full = lookalikes.has_hidden_lookalikes

    def both(cands):
        fast = full(cands)
        with monkeypatch.context() as m:
            m.setattr(lookalikes, "_line_may_hide", lambda panel: True)  # always render
            slow = full(cands)
        seen.append((fast, slow))
        return fast

    monkeypatch.setattr(candidate_sets, "has_hidden_lookalikes", both)
    for configuration in ("center_single", "distribute_four", "left_center_single_right_center_single"):
        for k in range(120):
            generate_problem(configuration, problem_rng(11, configuration, k), "balanced", "I-RAVEN-Mesh")
    assert len(seen) >= 360 and all(fast == slow for fast, slow in seen)
