"""Rendering: bit-exact against the reference panels, and the fast path against the plain drawing."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.generator import render
from rpm_lib.generator.constants import COLOR_VALUES, LAYOUTS
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel
from rpm_lib.generator.xml_io import read_problem_xml


def _reference_files(root: Path) -> list[Path]:
    files = sorted(root.glob("*/RAVEN_*.xml"))
    assert files, f"no reference .xml under {root}"
    return files


@pytest.mark.parametrize("dataset", ["I-RAVEN", "RAVEN"])
def test_every_reference_panel_is_rerendered_bit_exactly(dataset, request):
    root = request.getfixturevalue("iraven_reference" if dataset == "I-RAVEN" else "raven_reference")
    checked = equal = 0
    mismatches = []
    for path in _reference_files(root):
        image = render.render_problem(read_problem_xml(path))
        with np.load(path.with_suffix(".npz")) as data:
            stored = data["image"]
        same = (image == stored).all(axis=(1, 2))
        checked += same.size
        equal += int(same.sum())
        mismatches += [f"{path.parent.name}/{path.stem} panel {i}" for i in np.flatnonzero(~same)]
    assert checked == 16 * len(_reference_files(root))
    assert equal == checked, f"{checked - equal} of {checked} panels differ, e.g. {mismatches[:5]}"


def test_stored_masks_and_real_bboxes_are_reproduced(iraven_reference, raven_reference):
    seen: dict[tuple, tuple[str, str]] = {}
    for root in (iraven_reference, raven_reference):
        for path in _reference_files(root):
            for element in ET.parse(path).getroot().iter("Entity"):
                bbox = tuple(json.loads(element.get("bbox")))
                key = (bbox, int(element.get("Type")), int(element.get("Size")), int(element.get("Angle")))
                seen[key] = (element.get("mask"), element.get("real_bbox"))
    assert len(seen) > 1000  # a broad sample of slots x types x sizes x angles
    for key, (mask, real) in seen.items():
        assert render.rle_encode(render.entity_mask(*key)) == mask, key
        assert json.dumps(render.real_bbox(*key)) == real, key


def _all_slot_boxes() -> list[tuple]:
    return sorted({slot for layout in LAYOUTS.values() if not layout.lines for slot in layout.slots})


@pytest.mark.parametrize("angle_level", range(8))
def test_cropped_layers_equal_the_full_size_reference_drawing_for_every_entity(angle_level):
    """Exhaustive: every slot x type x size x color at this angle (the crop / warp shortcuts are exact)."""
    for bbox in _all_slot_boxes():
        for type_level in range(1, 6):
            for size_level in range(6):
                for color_level in range(10):
                    fill = 255 - COLOR_VALUES[color_level]
                    full = render.reference_entity_layer(bbox, type_level, size_level, fill, angle_level)
                    y0, x0, crop = render.cropped_entity_layer(bbox, type_level, size_level, fill, angle_level)
                    h, w = crop.shape
                    where = (bbox, type_level, size_level, color_level, angle_level)
                    assert np.array_equal(full[y0:y0 + h, x0:x0 + w], crop), where
                    outside = full.copy()
                    outside[y0:y0 + h, x0:x0 + w] = 0
                    assert not outside.any(), f"entity drawn outside its crop: {where}"


def _panel(layout: str, slots: list[int], entities: list[Entity], uniformity: int = 0) -> ComponentPanel:
    return ComponentPanel(layout, uniformity, slots, entities)


def test_panel_is_white_with_black_outline_and_the_fill_value_inside():
    # A black (color 9) circle in the centre of center_single, radius 0.5 * 80 = 40 px.
    panel = Panel([_panel("Center_Single", [0], [Entity(type=5, size=1, color=9, angle=3)])])
    image = render.render_panel("center_single", panel)
    assert image.dtype == np.uint8 and image.shape == (160, 160)
    assert image[0, 0] == 255 and image[80, 80] == COLOR_VALUES[9]
    assert image[80, 80 - 40] == 0  # the outline
    gray = Panel([_panel("Center_Single", [0], [Entity(type=5, size=1, color=4, angle=3)])])
    assert render.render_panel("center_single", gray)[80, 80] == COLOR_VALUES[4]


def test_later_components_are_drawn_over_earlier_ones_and_unfilled_interiors_are_transparent():
    inner = Entity(type=2, size=5, color=9, angle=3)  # black square in the In slot
    for out_color, expected_between in ((0, 255), (5, COLOR_VALUES[5])):
        panel = Panel([
            _panel("Out_Center_Single", [0], [Entity(type=5, size=5, color=out_color, angle=3)]),
            _panel("In_Center_Single", [0], [inner]),
        ])
        image = render.render_panel("in_center_single_out_center_single", panel)
        assert image[80, 80] == COLOR_VALUES[9]            # the In entity is on top
        assert image[80, 80 + 40] == expected_between     # between In and Out: Out's fill (or white)


def test_structure_lines_are_drawn_last():
    left_right = Panel([
        _panel("Left_Center_Single", [0], [Entity(5, 5, 9, 3)]),
        _panel("Right_Center_Single", [0], [Entity(5, 5, 9, 3)]),
    ])
    image = render.render_panel("left_center_single_right_center_single", left_right)
    assert (image[:, 80] == 0).all() and image[5, 79] == 255
    up_down = Panel([
        _panel("Up_Center_Single", [0], [Entity(1, 0, 0, 3)]),
        _panel("Down_Center_Single", [0], [Entity(1, 0, 0, 3)]),
    ])
    image = render.render_panel("up_center_single_down_center_single", up_down)
    assert (image[80, :] == 0).all() and (image[:, 80] != 0).any()


def test_render_panel_rejects_bad_input_with_a_clear_message():
    good = Panel([_panel("Center_Single", [0], [Entity(1, 0, 0, 3)])])
    with pytest.raises(ValueError, match="unknown configuration"):
        render.render_panel("center", good)
    with pytest.raises(ValueError, match="component"):
        render.render_panel("in_center_single_out_center_single", good)
    with pytest.raises(ValueError, match="Type=0"):
        render.render_panel("center_single", Panel([_panel("Center_Single", [0], [Entity(0, 0, 0, 3)])]))
    with pytest.raises(ValueError, match="slot 4 out of range"):
        render.render_panel("distribute_four", Panel([_panel("Distribute_Four", [4], [Entity(1, 0, 0, 3)])]))


def test_rle_encoding_is_one_based_row_major_and_round_trips():
    mask = np.zeros((4, 5), bool)
    mask[0, 0] = mask[1, 3] = mask[1, 4] = mask[2, 0] = True  # (1,4),(2,0) form one run: 9..11
    assert render.rle_encode(mask) == "[1,1,9,3]"
    assert np.array_equal(render.rle_decode("[1,1,9,3]", (4, 5)), mask)
    with pytest.raises(ValueError, match="outside"):
        render.rle_decode("[19,5]", (4, 5))
    with pytest.raises(ValueError, match="odd"):
        render.rle_decode("[1,2,3]", (4, 5))


def test_sprite_cache_stays_within_its_byte_budget_and_returns_correct_sprites():
    cache = render._SpriteCache(max_bytes=60_000)
    keys = [((0.5, 0.5, 1, 1), t, s, 9, 3) for t in range(1, 6) for s in range(6)]
    for key in keys:
        sprite = cache.get(*key)
        assert cache._bytes <= 60_000 or len(cache) == 1
        fresh = render.make_sprite(*key)
        assert sprite.y0 == fresh.y0 and np.array_equal(sprite.ink, fresh.ink)
    assert len(cache) < len(keys)  # some were evicted
    cache.get(*keys[-1])
    assert cache.hits == 1
