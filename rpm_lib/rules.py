"""Rule vocabularies and rule encodings for RAVEN / I-RAVEN and PGM.

(Vocabulary section below; encoders/decoders follow.)
"""
from __future__ import annotations

# ----------------------------------------------------------------------------------------------
# RAVEN / I-RAVEN vocabulary
# ----------------------------------------------------------------------------------------------

#: The 7 configurations: on-disk folder names, in the order used everywhere in rpm_lib (tables, plots).
CONFIGURATIONS: tuple[str, ...] = (
    "center_single",
    "distribute_four",
    "distribute_nine",
    "left_center_single_right_center_single",
    "up_center_single_down_center_single",
    "in_center_single_out_center_single",
    "in_distribute_four_out_center_single",
)

#: The paper's short names (Table 1 columns).
SHORT_NAMES: dict[str, str] = {
    "center_single": "Center",
    "distribute_four": "2x2Grid",
    "distribute_nine": "3x3Grid",
    "left_center_single_right_center_single": "L-R",
    "up_center_single_down_center_single": "U-D",
    "in_center_single_out_center_single": "O-IC",
    "in_distribute_four_out_center_single": "O-IG",
}

#: The 4 relations (columns 0..3 of ``meta_matrix`` / ``meta_target``).
RELATIONS: tuple[str, ...] = ("Constant", "Progression", "Arithmetic", "Distribute_Three")

#: The 5 ruled attributes (columns 4..8 of ``meta_matrix`` / ``meta_target``).
ATTRIBUTES: tuple[str, ...] = ("Number", "Position", "Type", "Size", "Color")

#: ``meta_target`` column names (9).
META_TARGET_FORMAT: tuple[str, ...] = RELATIONS + ATTRIBUTES

#: Rule groups, i.e. the row inside a component's 4-row block of ``meta_matrix``.
RULE_GROUPS: tuple[str, ...] = ("Number/Position", "Type", "Size", "Color")
