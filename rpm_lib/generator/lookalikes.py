"""Look-alike guard: would two candidates render to the same image? (docs/generator.md, "Look-alike candidates").

Two kinds: equal *rendered keys* (:func:`rendered_key`: the entities' slots and levels, with the render-identical
sizes of ``constants.RENDER_IDENTICAL_SIZES`` mapped to one representative), and, in Mesh problems, equal images
although the keys differ (a black Mesh line lying on a black-filled shape is invisible;
:func:`has_hidden_lookalikes`). The candidate generators (``candidates``, ``fair_candidates``) use them to avoid
two candidates that look the same.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from rpm_lib.generator.constants import (
    COLOR_MAX_LEVEL,
    IMAGE_SIZE,
    LAYOUTS,
    MESH_LAYOUT,
    RENDER_IDENTICAL_SIZES,
    configuration_of,
    has_mesh,
)
from rpm_lib.generator.problem import Panel

__all__ = ["rendered_key", "has_lookalikes", "has_hidden_lookalikes"]


def rendered_key(panel: Panel) -> tuple:
    """What the rendered image of ``panel`` depends on: per component, the set of (slot, type, size, color,
    angle) with render-identical sizes mapped to one representative. Equal keys => equal images."""
    key = []
    for comp in panel.components:
        if comp.layout == MESH_LAYOUT:  # all lines look alike: the slot set is the image
            key.append(frozenset(comp.slots))
            continue
        items = []
        for slot, e in zip(comp.slots, comp.entities):
            alias = RENDER_IDENTICAL_SIZES.get((comp.layout, e.type))
            size = alias.get(e.size, e.size) if alias else e.size
            items.append((slot, e.type, size, e.color, e.angle))
        key.append(frozenset(items))
    return tuple(key)


def has_lookalikes(candidates: list[Panel]) -> bool:
    """True when two candidates would render to the same image because their keys are equal."""
    return len({rendered_key(panel) for panel in candidates}) < len(candidates)


# A black-filled entity lies within its circumradius plus the crop margin of the renderer (outline, interpolation).
_HIDING_MARGIN = 4
# A line's ends may be covered by the lines meeting it at a lattice node; only its interior must be hidden.
_LINE_END_MARGIN = 4


@lru_cache(maxsize=None)
def _black_extent(layout: str, slot: int, type_level: int, size_level: int) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` px: a square holding every pixel of the entity at any angle."""
    from rpm_lib.generator.render import entity_geometry  # lazy: OpenCV only when needed

    geometry = entity_geometry(LAYOUTS[layout].slots[slot], type_level, size_level)
    reach = int(np.ceil(geometry.circumradius())) + _HIDING_MARGIN
    x, y = geometry.center
    return x - reach, y - reach, x + reach, y + reach


@lru_cache(maxsize=None)
def _line_interior(slot: int) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` px of Mesh line ``slot``'s pixels, less ``_LINE_END_MARGIN`` at both ends."""
    from rpm_lib.generator.render import line_pixels

    rows, cols = np.divmod(line_pixels(LAYOUTS[MESH_LAYOUT].slots[slot]), IMAGE_SIZE)
    x0, x1, y0, y1 = int(cols.min()), int(cols.max()), int(rows.min()), int(rows.max())
    if x1 - x0 > y1 - y0:  # horizontal
        return x0 + _LINE_END_MARGIN, y0, x1 - _LINE_END_MARGIN, y1
    return x0, y0 + _LINE_END_MARGIN, x1, y1 - _LINE_END_MARGIN


def _covered(low: int, high: int, intervals: list[tuple[int, int]]) -> bool:
    """Whether the union of the closed integer ``intervals`` covers ``low .. high``."""
    reach = low - 1
    for start, end in sorted(intervals):
        if start > reach + 1:
            break
        reach = max(reach, end)
        if reach >= high:
            return True
    return reach >= high


def _line_may_hide(panel: Panel) -> bool:
    """False when no Mesh line of ``panel`` can vanish under its black-filled shapes: a vanishing line's interior
    lies inside the black shapes, so inside the union of the squares around them (checked row by row along a
    horizontal line, column by column along a vertical one). A cheap necessary test that lets
    :func:`has_hidden_lookalikes` skip rendering in most problems that have a black shape (same answers)."""
    boxes = [_black_extent(comp.layout, slot, e.type, e.size) for comp in panel.components[:-1]
             for slot, e in zip(comp.slots, comp.entities) if e.color == COLOR_MAX_LEVEL]
    if not boxes:
        return False
    for slot in panel.components[-1].slots:
        x0, y0, x1, y1 = _line_interior(slot)
        if x1 - x0 > y1 - y0:  # horizontal: every pixel row of the line must be covered along x
            if all(_covered(x0, x1, [(b[0], b[2]) for b in boxes if b[1] <= y <= b[3]]) for y in range(y0, y1 + 1)):
                return True
        elif all(_covered(y0, y1, [(b[1], b[3]) for b in boxes if b[0] <= x <= b[2]]) for x in range(x0, x1 + 1)):
            return True
    return False


def has_hidden_lookalikes(candidates: list[Panel]) -> bool:
    """True when two Mesh candidates render to the same image although their keys differ: the Mesh's lines
    are black and drawn over the shapes, so a line lying entirely on a black-filled shape is invisible
    (measured: 1 of 14,000 generated Center problems had two such candidates before this check).

    Exact, and cheap in most problems: only a shape filled with the black Color level can hide a line -- every
    line keeps pixels outside the black pixels of all possible other entities and dividers of its configuration
    (checked exhaustively by tests/generator/test_mesh.py) -- so without one nothing is rendered; otherwise the
    shapes of each distinct shape part are rendered once and the lines drawn over a copy per candidate.
    """
    from rpm_lib.generator.render import draw_mesh_into, draw_panel_into  # lazy: OpenCV only when needed

    layouts = [c.layout for c in candidates[0].components]
    if not has_mesh(layouts):
        return False
    if not any(_line_may_hide(panel) for panel in candidates):  # no black shape, or none that can cover a line
        return False
    configuration = configuration_of(layouts[:-1])
    shapes: dict[tuple, np.ndarray] = {}
    images = set()
    for panel in candidates:
        part = Panel(panel.components[:-1])
        key = rendered_key(part)
        base = shapes.get(key)
        if base is None:
            base = shapes[key] = draw_panel_into(np.empty((IMAGE_SIZE, IMAGE_SIZE), np.uint8), configuration, part)
        images.add(draw_mesh_into(base.copy(), configuration, panel.components[-1]).tobytes())
    return len(images) < len(candidates)
