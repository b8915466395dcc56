"""Rendering of RAVEN / I-RAVEN panels, bit-exact with the reference generators (docs/generator.md, "Rendering").

A panel is 160x160 uint8, white (255) background. Each entity is drawn with OpenCV on its own zero
"layer" (fill value ``255 - COLOR_VALUES[color]``, outline 255, thickness 2), rotated about its centre
with ``warpAffine(INTER_LINEAR)`` and composited over the earlier entities wherever the layer is
non-zero; the structure line (Left_Right / Up_Down) is composited last; the panel is ``255 - layers``.

Speed: an entity layer depends only on (slot bbox, type, size, color, angle), so it is rendered once,
trimmed to its non-zero pixels and kept as a *sprite* in a per-process cache; compositing a panel is
then a few ``np.copyto`` calls on small crops. A sprite is rendered in a crop around the entity rather
than on a full 160x160 layer (at +-45/+-135 degrees only the top-left window up to the crop's far
corner is warped, see ``cropped_entity_layer``), and the identity warp at angle 0 is skipped. These
shortcuts are checked against the full-size reference drawing (``reference_entity_layer``) for *every*
possible entity in ``tests/generator/test_render.py``, and the whole renderer against the stored
reference panels (2,240 of 2,240 equal).

The .xml annotations of an entity (``real_bbox`` and the run-length ``mask``, docs/data-formats.md,
"Entity annotations") are computed here too and cached per (slot bbox, type, size, angle):
``entity_annotation``.

Mesh lines (docs/generator.md, "Mesh"): an entity of Type "line" sits in a Mesh slot ``(a, b, c, d)`` and
is drawn as ``cv2.line(layer, (int(b*160), int(a*160)), (int(d*160), int(c*160)), 255, 2)`` -- no fill, no
rotation, Size/Color/Angle ignored. The Mesh is the last component, so its lines are composited over every
shape, and before the Left_Right / Up_Down divider. Its ``real_bbox`` keeps a reference quirk: the two
endpoints are rotated by the entity's Angle value (-135 degrees at level 0) about the first endpoint,
although the line is never drawn rotated.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

from rpm_lib.generator.constants import (
    ANGLE_VALUES,
    COLOR_VALUES,
    CONFIG_SPECS,
    DEFAULT_WIDTH,
    IMAGE_SIZE,
    LAYOUTS,
    LINE_TYPE_LEVEL,
    MESH_LAYOUT,
    SHAPE_TYPE_LEVELS,
    SIZE_VALUES,
    TYPE_VALUES,
    configuration_components,
)
from rpm_lib.generator.problem import ComponentPanel, Panel, Problem

#: A slot bounding box ``(y_center, x_center, height, width)``, normalised to [0, 1].
BBox = tuple[float, float, float, float]

# Margin (px) kept around the unrotated shape's circumradius when rendering into a crop: the outline
# is 2 px thick (1 px beyond the vertices with LINE_8) and bilinear interpolation spreads 1 px more.
_CROP_MARGIN = 4

# Budget of the per-process sprite cache (bytes of pixel data). Every possible entity of one
# configuration takes <= 50 MB, of all seven 213 MB; workers handle one configuration at a time, so
# 192 MB keeps any configuration's working set while bounding memory when many workers run.
SPRITE_CACHE_BYTES = 192 * 2**20


# ---------------------------------------------------------------------------------------------------
# Geometry (docs/generator.md, "Rendering"; every coordinate is an int, ``int()`` truncates toward zero)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntityGeometry:
    """Unrotated outline of one entity in panel pixel coordinates.

    Attributes:
        kind: ``"polygon"`` (triangle, pentagon, hexagon), ``"rectangle"`` (square) or ``"circle"``.
        center: ``(x, y)`` rotation centre in px (column, row).
        points: polygon vertices ``((x, y), ...)``; for a rectangle its two opposite corners
            ``((x - d, y - d), (x + d, y + d))``; empty for a circle.
        radius: circle radius in px (0 for the other kinds).
    """

    kind: str
    center: tuple[int, int]
    points: tuple[tuple[int, int], ...]
    radius: int = 0

    def corner_points(self) -> tuple[tuple[int, int], ...]:
        """The vertices that ``real_bbox`` rotates (the 4 corners of a square, in the reference order)."""
        if self.kind != "rectangle":
            return self.points
        (x0, y0), (x1, y1) = self.points
        return ((x0, y0), (x0, y1), (x1, y1), (x1, y0))

    def circumradius(self) -> float:
        """Largest distance (px) of the outline's defining points from the centre."""
        if self.kind == "circle":
            return float(self.radius)
        cx, cy = self.center
        return max(math.hypot(x - cx, y - cy) for x, y in self.corner_points())


#: The slots that hold lines (Mesh) rather than shapes.
_LINE_SLOTS = frozenset(slot for spec in LAYOUTS.values() if spec.lines for slot in spec.slots)


def _check_entity_levels(type_level: int, size_level: int, color_level: int, angle_level: int) -> None:
    low, high = SHAPE_TYPE_LEVELS
    if not (low <= type_level <= high and 0 <= size_level < len(SIZE_VALUES)
            and 0 <= color_level < len(COLOR_VALUES) and 0 <= angle_level < len(ANGLE_VALUES)):
        raise ValueError(
            f"entity levels out of range: Type={type_level} ({low}..{high}), Size={size_level} (0..5), "
            f"Color={color_level} (0..9), Angle={angle_level} (0..7)"
        )


def _check_line(slot: BBox, type_level: int, size_level: int, color_level: int, angle_level: int) -> None:
    """A Mesh slot holds exactly the line entity (Type 6, Size/Color/Angle level 0); a shape slot no line."""
    if slot in _LINE_SLOTS:
        if (type_level, size_level, color_level, angle_level) != (LINE_TYPE_LEVEL, 0, 0, 0):
            raise ValueError(
                f"Mesh slot {list(slot)} holds Type={type_level} Size={size_level} Color={color_level} "
                f"Angle={angle_level}; a Mesh line is Type={LINE_TYPE_LEVEL} Size=0 Color=0 Angle=0"
            )
    elif type_level == LINE_TYPE_LEVEL:
        raise ValueError(f"a line (Type={LINE_TYPE_LEVEL}) can only sit in a Mesh slot, not in {list(slot)}")
    else:
        _check_entity_levels(type_level, size_level, color_level, angle_level)


def line_endpoints(slot: BBox) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two endpoints ``((x1, y1), (x2, y2))`` in px (column, row) of a Mesh slot ``(a, b, c, d)``."""
    return (int(slot[1] * IMAGE_SIZE), int(slot[0] * IMAGE_SIZE)), (int(slot[3] * IMAGE_SIZE), int(slot[2] * IMAGE_SIZE))


def reference_line_layer(slot: BBox) -> np.ndarray:
    """The reference drawing of a Mesh line: uint8 ``(160, 160)``, 255 on the line (3 px wide), 0 elsewhere."""
    layer = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    start, end = line_endpoints(slot)
    cv2.line(layer, start, end, 255, DEFAULT_WIDTH)
    return layer


def _unit(bbox: BBox) -> float:
    # Same operation order as the reference (min(h, w) * IMAGE_SIZE / 2) so that floats agree exactly.
    return min(bbox[2], bbox[3]) * IMAGE_SIZE / 2


def _center(bbox: BBox) -> tuple[int, int]:
    return int(bbox[1] * IMAGE_SIZE), int(bbox[0] * IMAGE_SIZE)


@lru_cache(maxsize=None)
def entity_geometry(bbox: BBox, type_level: int, size_level: int) -> EntityGeometry:
    """Outline of an entity of Type level ``type_level`` (1..5) and Size level ``size_level`` (0..5) in ``bbox``."""
    shape = TYPE_VALUES[type_level]
    size = SIZE_VALUES[size_level]
    unit = _unit(bbox)
    x, y = _center(bbox)
    if shape == "triangle":
        dl = int(unit * size)
        a, b = int(dl / 2.0 * math.sqrt(3)), int(dl / 2.0)
        return EntityGeometry("polygon", (x, y), ((x, y - dl), (x + a, y + b), (x - a, y + b)))
    if shape == "square":
        dl = int(unit / 2 * np.sqrt(2) * size)
        return EntityGeometry("rectangle", (x, y), ((x - dl, y - dl), (x + dl, y + dl)))
    if shape == "pentagon":
        dl = int(unit * size)
        c18, s18 = int(dl * np.cos(np.pi / 10)), int(dl * np.sin(np.pi / 10))
        s36, c36 = int(dl * np.sin(np.pi / 5)), int(dl * np.cos(np.pi / 5))
        return EntityGeometry(
            "polygon", (x, y),
            ((x, y - dl), (x - c18, y - s18), (x - s36, y + c36), (x + s36, y + c36), (x + c18, y - s18)),
        )
    if shape == "hexagon":
        dl = int(unit * size)
        a, b = int(dl / 2.0 * np.sqrt(3)), int(dl / 2.0)
        return EntityGeometry(
            "polygon", (x, y),
            ((x, y - dl), (x - a, y - b), (x - a, y + b), (x, y + dl), (x + a, y + b), (x + a, y - b)),
        )
    if shape == "circle":
        return EntityGeometry("circle", (x, y), (), int(unit * size))
    raise ValueError(f"cannot render Type level {type_level} ({shape!r}); expected 1..5")


# ---------------------------------------------------------------------------------------------------
# Entity layers
# ---------------------------------------------------------------------------------------------------


def _draw_shape(layer: np.ndarray, geometry: EntityGeometry, fill: int, offset: tuple[int, int]) -> None:
    """Draw ``geometry`` (panel coordinates) into ``layer`` whose pixel (0, 0) is panel pixel ``offset`` = (x0, y0)."""
    ox, oy = offset
    width = DEFAULT_WIDTH
    if geometry.kind == "circle":
        center = (geometry.center[0] - ox, geometry.center[1] - oy)
        if fill != 0:
            cv2.circle(layer, center, geometry.radius, fill, -1)
        cv2.circle(layer, center, geometry.radius, 255, width)
    elif geometry.kind == "rectangle":
        (x0, y0), (x1, y1) = geometry.points
        pt1, pt2 = (x0 - ox, y0 - oy), (x1 - ox, y1 - oy)
        if fill != 0:
            cv2.rectangle(layer, pt1, pt2, fill, -1)
        cv2.rectangle(layer, pt1, pt2, 255, width)
    else:
        pts = np.array([(px - ox, py - oy) for px, py in geometry.points], np.int32).reshape(-1, 1, 2)
        if fill != 0:
            cv2.fillConvexPoly(layer, pts, fill)
        cv2.polylines(layer, [pts], True, 255, width)


def reference_entity_layer(bbox: BBox, type_level: int, size_level: int, fill: int, angle_level: int) -> np.ndarray:
    """The reference drawing: a full 160x160 uint8 layer, always warped (docs/generator.md "Rendering", no shortcuts).

    ``fill`` is the layer value of the interior (``255 - COLOR_VALUES[color]``; 0 = outline only;
    255 = the fully filled shape used for the .xml mask). Used to verify the fast path.
    """
    geometry = entity_geometry(bbox, type_level, size_level)
    layer = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    _draw_shape(layer, geometry, fill, (0, 0))
    matrix = cv2.getRotationMatrix2D(geometry.center, ANGLE_VALUES[angle_level], 1)
    return cv2.warpAffine(layer, matrix, (IMAGE_SIZE, IMAGE_SIZE), flags=cv2.INTER_LINEAR)


def crop_window(geometry: EntityGeometry) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` (exclusive ends) of the square crop that holds the entity at any rotation."""
    reach = int(math.ceil(geometry.circumradius())) + _CROP_MARGIN
    cx, cy = geometry.center
    return max(cx - reach, 0), max(cy - reach, 0), min(cx + reach + 1, IMAGE_SIZE), min(cy + reach + 1, IMAGE_SIZE)


def cropped_entity_layer(
    bbox: BBox, type_level: int, size_level: int, fill: int, angle_level: int
) -> tuple[int, int, np.ndarray]:
    """The entity layer rendered in a crop: ``(y0, x0, layer)``, ``layer`` uint8 ``(h, w)``.

    Equals ``reference_entity_layer(...)[y0:y0+h, x0:x0+w]``, which is zero elsewhere (verified for
    every possible entity by the tests). Why each shortcut is exact:

    * angle 0: the rotation matrix is exactly the identity, and OpenCV's fixed-point bilinear
      interpolation at integer source coordinates returns the source pixel, so the warp is skipped;
    * angles +-90 and 180: the source coordinates are integers whatever the origin, so warping a crop
      centred on the rotation centre permutes exactly the same pixels as the full-size warp;
    * angles +-45 and +-135: OpenCV rounds ``M[0]*x`` and ``M[1]*y + M[2]`` to 1/1024 px separately
      per destination column / row, so a shifted origin can change the rounding (we measured up to 8
      gray levels). The warp is therefore done on the full-size coordinate frame, but only over the
      top-left window that ends at the crop's far corner (each output pixel depends only on its own
      absolute coordinates, so a prefix window is exact).
    """
    geometry = entity_geometry(bbox, type_level, size_level)
    x0, y0, x1, y1 = crop_window(geometry)
    angle = ANGLE_VALUES[angle_level]
    if angle % 90 == 0:
        layer = np.zeros((y1 - y0, x1 - x0), np.uint8)
        _draw_shape(layer, geometry, fill, (x0, y0))
        if angle != 0:
            center = (geometry.center[0] - x0, geometry.center[1] - y0)
            matrix = cv2.getRotationMatrix2D(center, angle, 1)
            layer = cv2.warpAffine(layer, matrix, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR)
        return y0, x0, layer
    canvas = np.zeros((y1, x1), np.uint8)
    _draw_shape(canvas, geometry, fill, (0, 0))
    matrix = cv2.getRotationMatrix2D(geometry.center, angle, 1)
    canvas = cv2.warpAffine(canvas, matrix, (x1, y1), flags=cv2.INTER_LINEAR)
    return y0, x0, canvas[y0:, x0:]


# ---------------------------------------------------------------------------------------------------
# Sprites (cached, trimmed entity layers in panel space)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sprite:
    """A trimmed entity layer ready for compositing.

    Attributes:
        y0, x0: panel coordinates (row, column) of ``ink[0, 0]``.
        ink: uint8 ``(h, w)``: the final panel value ``255 - layer`` where the entity is opaque.
        opaque: bool ``(h, w)``: ``layer > 0`` (where the entity replaces what lies below it).
    """

    y0: int
    x0: int
    ink: np.ndarray
    opaque: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.ink.nbytes + self.opaque.nbytes


def _trimmed(y0: int, x0: int, layer: np.ndarray) -> tuple[int, int, np.ndarray]:
    """Cut ``layer`` (whose pixel (0, 0) is panel pixel (y0, x0)) to the bounding box of its non-zero pixels."""
    x, y, w, h = cv2.boundingRect(layer)  # on a single-channel image: box of the non-zero pixels
    return y0 + y, x0 + x, layer[y:y + h, x:x + w]


class _SpriteCache:
    """LRU cache of sprites keyed by (bbox, type, size, color, angle) levels, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, Sprite] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, bbox: BBox, type_level: int, size_level: int, color_level: int, angle_level: int) -> Sprite:
        key = (bbox, type_level, size_level, color_level, angle_level)
        sprite = self._items.get(key)
        if sprite is not None:
            self.hits += 1
            self._items.move_to_end(key)
            return sprite
        self.misses += 1
        sprite = make_sprite(bbox, type_level, size_level, color_level, angle_level)
        self._items[key] = sprite
        self._bytes += sprite.nbytes
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes
        return sprite

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


def make_sprite(bbox: BBox, type_level: int, size_level: int, color_level: int, angle_level: int) -> Sprite:
    """Render one entity (all arguments are levels; ``bbox`` is its slot) into a trimmed sprite."""
    _check_line(bbox, type_level, size_level, color_level, angle_level)
    if type_level == LINE_TYPE_LEVEL:
        y0, x0, layer = _trimmed(0, 0, reference_line_layer(bbox))
    else:
        fill = 255 - COLOR_VALUES[color_level]
        y0, x0, layer = _trimmed(*cropped_entity_layer(bbox, type_level, size_level, fill, angle_level))
    opaque = layer > 0
    ink = 255 - layer  # where the layer is 0 the value is never used (not opaque)
    ink.flags.writeable = False
    opaque.flags.writeable = False
    return Sprite(y0, x0, ink, opaque)


SPRITES = _SpriteCache(SPRITE_CACHE_BYTES)


# ---------------------------------------------------------------------------------------------------
# Panels and problems
# ---------------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def line_pixels(slot: BBox) -> np.ndarray:
    """Flat (row-major) indices into a 160x160 panel of the pixels of the Mesh line in ``slot`` (read-only)."""
    indices = np.flatnonzero(reference_line_layer(slot))
    indices.flags.writeable = False
    return indices


@lru_cache(maxsize=None)
def _layout_line_pixels(layout: str) -> tuple[np.ndarray, ...]:
    """``line_pixels`` of every slot of a line layout, by slot index (a tuple lookup per line, no hashing)."""
    return tuple(line_pixels(slot) for slot in LAYOUTS[layout].slots)


def draw_mesh_into(out: np.ndarray, configuration: str, component: ComponentPanel) -> np.ndarray:
    """Composite the Mesh ``component``'s lines over ``out`` (uint8 ``(160, 160)``, in place) and return it.

    Lines are opaque and all black (a layer of 0 / 255 without interpolation), so compositing them in any
    order -- before or after the Left_Right / Up_Down divider, which is black too -- is setting their pixels
    to 0: one fancy assignment instead of a sprite per line (exactness checked against the reference panels).
    """
    slots = LAYOUTS[MESH_LAYOUT].slots
    if component.layout != MESH_LAYOUT:
        raise ValueError(f"{configuration}: draw_mesh_into needs the {MESH_LAYOUT} component, got {component.layout!r}")
    if len(component.slots) != len(component.entities):
        raise ValueError(f"{configuration}/{MESH_LAYOUT}: {len(component.slots)} slots but "
                         f"{len(component.entities)} entities")
    for entity in component.entities:
        if entity.type != LINE_TYPE_LEVEL or entity.size or entity.color or entity.angle:
            raise ValueError(
                f"{configuration}/{MESH_LAYOUT}: an entity has Type={entity.type} Size={entity.size} "
                f"Color={entity.color} Angle={entity.angle}; a Mesh line is Type={LINE_TYPE_LEVEL} Size=0 "
                "Color=0 Angle=0"
            )
    if not component.slots:
        return out
    lines = _layout_line_pixels(MESH_LAYOUT)
    try:
        # slots index a tuple: a negative slot would wrap around silently, hence the explicit minimum
        pixels = np.concatenate([lines[slot] for slot in component.slots])
        bad = min(component.slots) < 0
    except IndexError:
        bad = True
    if bad:
        raise ValueError(f"{configuration}/{MESH_LAYOUT}: slots {component.slots} out of range 0..{len(slots) - 1}")
    if out.flags.c_contiguous:
        out.reshape(-1)[pixels] = 0  # a view: writes through
    else:
        out[np.unravel_index(pixels, out.shape)] = 0
    return out


def draw_panel_into(out: np.ndarray, configuration: str, panel: Panel) -> np.ndarray:
    """Render ``panel`` into ``out`` (uint8 ``(160, 160)``, overwritten) and return it.

    The panel has the configuration's components, or those plus the Mesh last (drawn over the shapes).
    """
    spec = CONFIG_SPECS.get(configuration)
    if spec is None:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {sorted(CONFIG_SPECS)}")
    components = spec.components
    if len(panel.components) == len(components) + 1:
        components = configuration_components(configuration, mesh=True)
    elif len(panel.components) != len(components):
        raise ValueError(
            f"{configuration}: a panel needs {len(components)} component(s) ({len(components) + 1} with the "
            f"Mesh), got {len(panel.components)}"
        )
    out.fill(255)
    get = SPRITES.get
    for component, (_name, layout) in zip(panel.components, components):
        if component.layout != layout:
            raise ValueError(f"{configuration}: component layout {component.layout!r}, expected {layout!r}")
        slots = LAYOUTS[layout].slots
        if len(component.slots) != len(component.entities):
            raise ValueError(
                f"{configuration}/{component.layout}: {len(component.slots)} slots but "
                f"{len(component.entities)} entities"
            )
        if layout == MESH_LAYOUT:
            draw_mesh_into(out, configuration, component)
            continue
        for slot, entity in zip(component.slots, component.entities):
            if not 0 <= slot < len(slots):
                raise ValueError(f"{configuration}/{component.layout}: slot {slot} out of range 0..{len(slots) - 1}")
            sprite = get(slots[slot], entity.type, entity.size, entity.color, entity.angle)
            h, w = sprite.ink.shape
            np.copyto(out[sprite.y0:sprite.y0 + h, sprite.x0:sprite.x0 + w], sprite.ink, where=sprite.opaque)
    half = IMAGE_SIZE // 2
    if spec.structure == "Left_Right":
        out[:, half] = 0
    elif spec.structure == "Up_Down":
        out[half, :] = 0
    return out


def render_panel(configuration: str, panel: Panel) -> np.ndarray:
    """Render one panel: uint8 ``(160, 160)``, 255 = white background, 0 = black outline."""
    return draw_panel_into(np.empty((IMAGE_SIZE, IMAGE_SIZE), np.uint8), configuration, panel)


def render_problem(problem: Problem) -> np.ndarray:
    """Render the 16 panels in file order (8 context, then the 8 candidates): uint8 ``(16, 160, 160)``."""
    panels = problem.panels
    if len(panels) != 16:
        raise ValueError(f"a problem needs 8 context panels and 8 candidates, got {len(panels)} panels")
    image = np.empty((16, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    for i, panel in enumerate(panels):
        draw_panel_into(image[i], problem.configuration, panel)
    return image


# ---------------------------------------------------------------------------------------------------
# .xml annotations: real_bbox and mask RLE (docs/data-formats.md, "Entity annotations")
# ---------------------------------------------------------------------------------------------------


def real_bbox(bbox: BBox, type_level: int, size_level: int, angle_level: int) -> list[float]:
    """``[y_center, x_center, height, width]`` of the rotated shape (normalised, rounded to 4 decimals).

    The circle uses the *untruncated* radius; polygons rotate their integer vertices with the
    OpenCV rotation matrix. ``2 * 1.5 / 160`` is added to both extents for the outline. A Mesh line
    (``type_level`` 6, ``bbox`` its slot) rotates its two endpoints about the first one by the Angle
    value, as the reference does (the line itself is drawn unrotated).
    """
    delta = DEFAULT_WIDTH * 1.5 / IMAGE_SIZE
    if type_level == LINE_TYPE_LEVEL:
        start, end = line_endpoints(bbox)
        return _rotated_box(start, (start, end), angle_level, delta)
    geometry = entity_geometry(bbox, type_level, size_level)
    if geometry.kind != "circle":
        return _rotated_box(geometry.center, geometry.corner_points(), angle_level, delta)
    cx, cy = geometry.center
    radius = _unit(bbox) * SIZE_VALUES[size_level]
    extent = 2 * radius / IMAGE_SIZE + delta
    values = [cy * 1.0 / IMAGE_SIZE, cx * 1.0 / IMAGE_SIZE, extent, extent]
    return [float(v) for v in np.round(values, 4)]


def _rotated_box(center: tuple[int, int], points, angle_level: int, delta: float) -> list[float]:
    """``real_bbox`` of ``points`` (px, ``(x, y)``) rotated about ``center`` by the angle level: normalised
    ``[row centre, column centre, height + delta, width + delta]``, rounded to 4 decimals."""
    matrix = cv2.getRotationMatrix2D(center, ANGLE_VALUES[angle_level], 1)
    points = np.array(points, np.float64)
    # m0 * x + m1 * y + m2, summed left to right without FMA: this order reproduces every stored
    # real_bbox (np.dot's BLAS order flips some ties such as 0.15625 -> 0.1563).
    rows = matrix[1, 0] * points[:, 0] + matrix[1, 1] * points[:, 1] + matrix[1, 2]
    cols = matrix[0, 0] * points[:, 0] + matrix[0, 1] * points[:, 1] + matrix[0, 2]
    min_row, max_row = rows.min() / IMAGE_SIZE, rows.max() / IMAGE_SIZE
    min_col, max_col = cols.min() / IMAGE_SIZE, cols.max() / IMAGE_SIZE
    values = [(min_row + max_row) / 2, (min_col + max_col) / 2, max_row - min_row + delta, max_col - min_col + delta]
    return [float(v) for v in np.round(values, 4)]


def entity_mask(bbox: BBox, type_level: int, size_level: int, angle_level: int) -> np.ndarray:
    """bool ``(160, 160)``: pixels equal to 255 in the fully filled (fill = outline = 255), rotated layer
    (for a Mesh line: the drawn line)."""
    if type_level == LINE_TYPE_LEVEL:
        return reference_line_layer(bbox) == 255
    y0, x0, layer = cropped_entity_layer(bbox, type_level, size_level, 255, angle_level)
    mask = np.zeros((IMAGE_SIZE, IMAGE_SIZE), bool)
    h, w = layer.shape
    mask[y0:y0 + h, x0:x0 + w] = layer == 255
    return mask


def rle_encode(mask: np.ndarray) -> str:
    """Run-length string ``"[s1,l1,s2,l2,...]"`` of a 2-D bool mask: 1-based starts in the row-major flattening."""
    flat = np.concatenate(([False], np.asarray(mask, bool).ravel(), [False]))
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    edges[1::2] -= edges[::2]
    return "[" + ",".join(map(str, edges.tolist())) + "]"


def rle_decode(rle: str, shape: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> np.ndarray:
    """Inverse of ``rle_encode``: bool array of ``shape``. Raises ValueError on a malformed string."""
    text = rle.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"mask RLE must look like '[start,length,...]', got {rle[:40]!r}")
    body = text[1:-1].strip()
    numbers = [int(v) for v in body.split(",")] if body else []
    if len(numbers) % 2:
        raise ValueError(f"mask RLE has an odd number of values ({len(numbers)})")
    flat = np.zeros(shape[0] * shape[1], bool)
    for start, length in zip(numbers[::2], numbers[1::2]):
        if start < 1 or length < 0 or start - 1 + length > flat.size:
            raise ValueError(f"mask RLE run ({start}, {length}) lies outside a {shape} image")
        flat[start - 1:start - 1 + length] = True
    return flat.reshape(shape)


def _json_number_list(values) -> str:
    # json.dumps of Python floats / ints = what the reference wrote (shortest float repr).
    return json.dumps([v if isinstance(v, int) else float(v) for v in values])


@lru_cache(maxsize=None)
def bbox_json(bbox: BBox) -> str:
    """``bbox`` as the reference .xml writes it, e.g. ``"[0.5, 0.5, 1, 1]"``."""
    return _json_number_list(bbox)


@lru_cache(maxsize=None)
def layout_position_json(layout: str) -> str:
    """The Layout's ``Position`` attribute: all slots of ``layout`` as a JSON list."""
    return json.dumps([[v if isinstance(v, int) else float(v) for v in slot] for slot in LAYOUTS[layout].slots])


@lru_cache(maxsize=8192)
def entity_annotation(bbox: BBox, type_level: int, size_level: int, angle_level: int) -> str:
    """The .xml attributes after ``Type`` of an Entity: ``bbox="…" mask="…" real_bbox="…"``.

    Cached: at most 24 slots x 5 types x 6 sizes x 8 angles distinct values exist, plus the 12 Mesh lines.
    """
    _check_line(bbox, type_level, size_level, 0, angle_level)
    mask = rle_encode(entity_mask(bbox, type_level, size_level, angle_level))
    real = _json_number_list(real_bbox(bbox, type_level, size_level, angle_level))
    return f'bbox="{bbox_json(bbox)}" mask="{mask}" real_bbox="{real}"'
