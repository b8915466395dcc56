"""Constants of the RAVEN / I-RAVEN generators (values, layouts, configurations).

Levels are indices into the ``*_VALUES`` tables. Slot boxes are ``(y_center, x_center, height, width)``
normalised to [0, 1] (index 0 is the row coordinate), as in the reference .xml files.
"""
from __future__ import annotations

from dataclasses import dataclass

from rpm_lib.rules import RULE_GROUPS

IMAGE_SIZE = 160
DEFAULT_WIDTH = 2  # outline thickness in px

NUM_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 9)          # Number level -> entity count
UNI_VALUES = (False, False, False, True)          # Uniformity level -> uniform?
TYPE_VALUES = ("none", "triangle", "square", "pentagon", "hexagon", "circle")
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
    """A layout: its slots and the *unpruned* level ranges (inclusive) of its attributes."""

    name: str
    slots: tuple[tuple[float, float, float, float], ...]
    number: tuple[int, int]
    type: tuple[int, int] = (1, 5)
    size: tuple[int, int] = (0, 5)
    color: tuple[int, int] = (0, 9)
    uniformity: tuple[int, int] = (0, 3)
    angle: tuple[int, int] = (0, 7)


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
