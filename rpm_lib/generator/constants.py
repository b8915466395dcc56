"""Constants of the RAVEN / I-RAVEN generators (values, layouts, configurations), and of the I-RAVEN-Mesh
component (docs/generator.md, "Mesh").

Levels are indices into the ``*_VALUES`` tables. Slot boxes are ``(y_center, x_center, height, width)``
normalised to [0, 1] (index 0 is the row coordinate), as in the reference .xml files. The slots of the
Mesh layout are line segments instead, ``(a, b, c, d)``: drawn from pixel (x, y) = (b, a) * 160 to
(d, c) * 160 (``LayoutSpec.lines``).
"""
from __future__ import annotations

from dataclasses import dataclass

from rpm_lib.rules import MESH_NAME, RULE_GROUPS

IMAGE_SIZE = 160
DEFAULT_WIDTH = 2  # outline thickness in px

NUM_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)  # Number level -> entity count (10-12: Mesh lines only)
#: Highest Number level a *freshly sampled* count can take (the reference's ``NUM_MAX``, 9 entities). It
#: clamps the first panel of every row and the Arithmetic second column; counts made by rules or candidate
#: alternatives may exceed it. Only the Mesh (levels 0..11) notices: every shape layout stops at 8.
FRESH_NUMBER_MAX_LEVEL = 8
UNI_VALUES = (False, False, False, True)          # Uniformity level -> uniform?
TYPE_VALUES = ("none", "triangle", "square", "pentagon", "hexagon", "circle", "line")
#: Type levels of the shapes (triangle .. circle); level 6, "line", is the Mesh's only type.
SHAPE_TYPE_LEVELS = (1, 5)
LINE_TYPE_LEVEL = 6
SIZE_VALUES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
COLOR_VALUES = (255, 224, 196, 168, 140, 112, 84, 56, 28, 0)  # fill pixel value; level 0 = white
ANGLE_VALUES = (-135, -90, -45, 0, 45, 90, 135, 180)          # degrees

META_STRUCTURE_FORMAT = (
    "Singleton", "Left_Right", "Up_Down", "Out_In", "Left", "Right", "Up", "Down", "Out", "In", "Grid",
    "Center_Single", "Distribute_Four", "Distribute_Nine", "Left_Center_Single", "Right_Center_Single",
    "Up_Center_Single", "Down_Center_Single", "Out_Center_Single", "In_Center_Single", "In_Distribute_Four",
)


@dataclass(frozen=True)
class LayoutSpec:
    """A layout: its slots and the *unpruned* level ranges (inclusive) of its attributes.

    ``lines``: the slots are line segments ``(a, b, c, d)`` (the Mesh) instead of boxes
    ``(y_center, x_center, height, width)``.
    """

    name: str
    slots: tuple[tuple[float, float, float, float], ...]
    number: tuple[int, int]
    type: tuple[int, int] = SHAPE_TYPE_LEVELS
    size: tuple[int, int] = (0, 5)
    color: tuple[int, int] = (0, 9)
    uniformity: tuple[int, int] = (0, 3)
    angle: tuple[int, int] = (0, 7)
    lines: bool = False


_G3 = (0.16, 0.5, 0.83)
LAYOUTS: dict[str, LayoutSpec] = {
    "Center_Single": LayoutSpec("Center_Single", ((0.5, 0.5, 1, 1),), (0, 0)),
    "Distribute_Four": LayoutSpec(
        "Distribute_Four",
        ((0.25, 0.25, 0.5, 0.5), (0.25, 0.75, 0.5, 0.5), (0.75, 0.25, 0.5, 0.5), (0.75, 0.75, 0.5, 0.5)),
        (0, 3),
    ),
    "Distribute_Nine": LayoutSpec(
        "Distribute_Nine", tuple((y, x, 0.33, 0.33) for y in _G3 for x in _G3), (0, 8)
    ),
    "Left_Center_Single": LayoutSpec("Left_Center_Single", ((0.5, 0.25, 0.5, 0.5),), (0, 0)),
    "Right_Center_Single": LayoutSpec("Right_Center_Single", ((0.5, 0.75, 0.5, 0.5),), (0, 0)),
    "Up_Center_Single": LayoutSpec("Up_Center_Single", ((0.25, 0.5, 0.5, 0.5),), (0, 0)),
    "Down_Center_Single": LayoutSpec("Down_Center_Single", ((0.75, 0.5, 0.5, 0.5),), (0, 0)),
    "Out_Center_Single": LayoutSpec("Out_Center_Single", ((0.5, 0.5, 1, 1),), (0, 0), size=(3, 5), color=(0, 0)),
    "In_Center_Single": LayoutSpec("In_Center_Single", ((0.5, 0.5, 0.33, 0.33),), (0, 0)),
    "In_Distribute_Four": LayoutSpec(
        "In_Distribute_Four",
        ((0.42, 0.42, 0.15, 0.15), (0.42, 0.58, 0.15, 0.15), (0.58, 0.42, 0.15, 0.15), (0.58, 0.58, 0.15, 0.15)),
        (0, 3),
        size=(2, 5),
    ),
}

# ------------------------------------------------------------------------------------------------
# The I-RAVEN-Mesh component (docs/generator.md, "Mesh")
# ------------------------------------------------------------------------------------------------

#: Component and layout name of the Mesh, the extra last component of every configuration of I-RAVEN-Mesh.
MESH_COMPONENT = MESH_NAME
MESH_LAYOUT = "Mesh_Layout"

#: The 12 unit edges of a 3x3-node lattice (nodes at pixels 12, 80, 147), as the reference stores them:
#: ``(a, b, c, d)`` is drawn from (x, y) = (int(b*160), int(a*160)) to (int(d*160), int(c*160)). The
#: order matters: slot ``i + 3`` (mod 12) is slot ``i`` rotated 90 degrees counter-clockwise on screen
#: about the panel centre, which is what a Progression on the Mesh's Position does per column.
MESH_SLOTS: tuple[tuple[float, float, float, float], ...] = (
    (0.08, 0.08, 0.5, 0.08),    # left edge, upper half
    (0.5, 0.08, 0.92, 0.08),    # left edge, lower half
    (0.5, 0.08, 0.5, 0.5),      # middle horizontal, left half
    (0.92, 0.08, 0.92, 0.5),    # bottom edge, left half
    (0.92, 0.5, 0.92, 0.92),    # bottom edge, right half
    (0.5, 0.5, 0.92, 0.5),      # middle vertical, lower half
    (0.5, 0.92, 0.92, 0.92),    # right edge, lower half
    (0.08, 0.92, 0.5, 0.92),    # right edge, upper half
    (0.5, 0.5, 0.5, 0.92),      # middle horizontal, right half
    (0.08, 0.5, 0.08, 0.92),    # top edge, right half
    (0.08, 0.08, 0.08, 0.5),    # top edge, left half
    (0.08, 0.5, 0.5, 0.5),      # middle vertical, upper half
)

#: Slot-index shift of one column of a Progression on the Mesh's Position: +3 (90 degrees counter-clockwise)
#: for a positive rule value, -3 for a negative one, whatever its size (feasibility still uses |value|).
MESH_ROTATION_STEP = 3

# 1..12 lines; one entity kind: Type "line", Size/Color/Angle level 0 (the renderer ignores them).
LAYOUTS[MESH_LAYOUT] = LayoutSpec(
    MESH_LAYOUT, MESH_SLOTS, (0, 11),
    type=(LINE_TYPE_LEVEL, LINE_TYPE_LEVEL), size=(0, 0), color=(0, 0), angle=(0, 0), lines=True,
)


def progression_position_shift(layout: str, value: int) -> int:
    """Slot-index shift per column of a Progression rule on Position with parameter ``value`` (+-1, +-2)."""
    if layout == MESH_LAYOUT:
        return MESH_ROTATION_STEP if value > 0 else -MESH_ROTATION_STEP
    return value


@dataclass(frozen=True)
class ConfigurationSpec:
    """A configuration: structure name and its components as (component name, layout name)."""

    folder: str
    structure: str
    components: tuple[tuple[str, str], ...]


CONFIG_SPECS: dict[str, ConfigurationSpec] = {
    "center_single": ConfigurationSpec("center_single", "Singleton", (("Grid", "Center_Single"),)),
    "distribute_four": ConfigurationSpec("distribute_four", "Singleton", (("Grid", "Distribute_Four"),)),
    "distribute_nine": ConfigurationSpec("distribute_nine", "Singleton", (("Grid", "Distribute_Nine"),)),
    "left_center_single_right_center_single": ConfigurationSpec(
        "left_center_single_right_center_single", "Left_Right",
        (("Left", "Left_Center_Single"), ("Right", "Right_Center_Single")),
    ),
    "up_center_single_down_center_single": ConfigurationSpec(
        "up_center_single_down_center_single", "Up_Down",
        (("Up", "Up_Center_Single"), ("Down", "Down_Center_Single")),
    ),
    "in_center_single_out_center_single": ConfigurationSpec(
        "in_center_single_out_center_single", "Out_In",
        (("Out", "Out_Center_Single"), ("In", "In_Center_Single")),
    ),
    "in_distribute_four_out_center_single": ConfigurationSpec(
        "in_distribute_four_out_center_single", "Out_In",
        (("Out", "Out_Center_Single"), ("In", "In_Distribute_Four")),
    ),
}

def configuration_components(configuration: str, mesh: bool = False) -> tuple[tuple[str, str], ...]:
    """The components of ``configuration`` as ``(component name, layout name)``, plus the Mesh last when
    ``mesh`` (component index 1 in the one-component configurations, 2 in the others)."""
    spec = CONFIG_SPECS.get(configuration)
    if spec is None:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIG_SPECS)}")
    return spec.components + (((MESH_COMPONENT, MESH_LAYOUT),) if mesh else ())


def configuration_of(layouts) -> str:
    """The configuration whose components have the layout names ``layouts`` (in order, without the Mesh):
    the inverse of :func:`configuration_components` (no two configurations share their layouts)."""
    layouts = tuple(layouts)
    for name, spec in CONFIG_SPECS.items():
        if tuple(layout for _, layout in spec.components) == layouts:
            return name
    raise ValueError(f"no configuration has the component layouts {list(layouts)}")


def mesh_component_index(configuration: str) -> int:
    """Component index of the Mesh in a Mesh problem of ``configuration`` (1 or 2)."""
    return len(configuration_components(configuration))


def has_mesh(layouts) -> bool:
    """Whether a panel whose components have the layout names ``layouts`` (in order) carries the Mesh."""
    layouts = list(layouts)
    if MESH_LAYOUT in layouts[:-1]:
        raise ValueError(f"the Mesh must be the last component, got layouts {layouts}")
    return bool(layouts) and layouts[-1] == MESH_LAYOUT


# ------------------------------------------------------------------------------------------------
# Rule menu (docs/generator.md, "Rule menu") -- added for the sampler.
# ------------------------------------------------------------------------------------------------

#: The 4 rule groups of a component, in ``meta_matrix`` row order.
RULE_GROUP_NAMES: tuple[str, ...] = RULE_GROUPS

#: Per rule group, the menu entries ``(relation, attribute, parameters)``. The reference sampler picks an
#: entry uniformly, then a parameter uniformly (``()`` = no parameter, value 0). Progression parameters are
#: level steps; Arithmetic parameters are the sign (+1 add / set union, -1 subtract / set difference).
RULE_MENU: tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...] = (
    (
        ("Progression", "Number", (-2, -1, 1, 2)),
        ("Progression", "Position", (-2, -1, 1, 2)),
        ("Arithmetic", "Number", (1, -1)),
        ("Arithmetic", "Position", (1, -1)),
        ("Distribute_Three", "Number", ()),
        ("Distribute_Three", "Position", ()),
        ("Constant", "Number/Position", ()),
    ),
    (
        ("Progression", "Type", (-2, -1, 1, 2)),
        ("Distribute_Three", "Type", ()),
        ("Constant", "Type", ()),
    ),
    (
        ("Progression", "Size", (-2, -1, 1, 2)),
        ("Arithmetic", "Size", (1, -1)),
        ("Distribute_Three", "Size", ()),
        ("Constant", "Size", ()),
    ),
    (
        ("Progression", "Color", (-2, -1, 1, 2)),
        ("Arithmetic", "Color", (1, -1)),
        ("Distribute_Three", "Color", ()),
        ("Constant", "Color", ()),
    ),
)

#: Highest Color level (black); the Arithmetic-Color "white alarm" tests against it (docs/generator.md,
#: "Rules on Type, Size and Color").
COLOR_MAX_LEVEL: int = len(COLOR_VALUES) - 1

#: Size levels that the reference renderer (docs/generator.md, "Rendering") draws pixel-identically, per
#: (layout, Type level), as
#: ``{size level: representative size level}``. A square's half side is ``int(unit / 2 * sqrt(2) * size)`` px;
#: in the 12 px In_Distribute_Four slots sizes 0.6 and 0.7 both give 5 px. This is the only such pair over all
#: layouts, types and angles (checked against ``render`` in tests/generator/test_candidates.py). The
#: candidate generators use it to avoid two candidates that look the same.
RENDER_IDENTICAL_SIZES: dict[tuple[str, int], dict[int, int]] = {("In_Distribute_Four", 2): {3: 2}}
