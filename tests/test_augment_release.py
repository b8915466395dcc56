"""The ``release`` augmentation recipe (the MLCL release's pipeline) beside rpm_lib's ``official`` one."""
from __future__ import annotations

import pickle

import albumentations as A
import cv2
import numpy as np
import pytest

from rpm_lib.augment import (RECIPES, RELEASE_ROLL_MAX, RELEASE_ROLL_VH_MAX_DX, RandomRoll, RpmAugment,
                             _walk)


def _tree(recipe: str) -> list[tuple[str, float]]:
    """(class name, p) of every transform in a recipe's pipeline, in order."""
    return [(type(t).__name__, t.p) for t in _walk(RECIPES[recipe].build())]


def test_release_recipe_has_the_official_structure_and_probabilities() -> None:
    assert _tree("release") == _tree("official")
    assert _tree("release_position_preserving") == _tree("position_preserving")
    assert RECIPES["release"].p == RECIPES["official"].p == 0.5
    assert RECIPES["release"].position_fallback == "release_position_preserving"
    assert not any(isinstance(t, RandomRoll | A.RandomGridShuffle)
                   for t in _walk(RECIPES["release_position_preserving"].build()))
    pickle.loads(pickle.dumps(RECIPES["release"]))  # travels to spawned DataLoader workers


def _rotate(recipe: str) -> A.Rotate:
    (rotate,) = [t for t in _walk(RECIPES[recipe].build()) if isinstance(t, A.Rotate)]
    return rotate


def test_release_rotation_reflects_into_the_corners_and_official_fills_white() -> None:
    assert _rotate("release").border_mode == cv2.BORDER_REFLECT_101
    assert _rotate("official").border_mode == cv2.BORDER_CONSTANT and _rotate("official").fill == 255
    image = np.zeros((40, 40, 16), np.uint8)  # all black: a white corner can only come from a constant fill
    for recipe, corner_value in (("release", 0), ("official", 255)):
        rotate = _rotate(recipe)
        out = A.Compose([A.Rotate(limit=(45, 45), interpolation=cv2.INTER_LINEAR, border_mode=rotate.border_mode,
                                  fill=rotate.fill, p=1.0)], strict=True)(image=image)["image"]
        assert (out[0, 0] == corner_value).all() and (out[-1, -1] == corner_value).all(), recipe


def _roll_offsets(roll: RandomRoll, draws: int = 3000, size: int = 80) -> np.ndarray:
    """(draws, 2) offsets (dy, dx) that ``roll`` picks for a ``size`` px image."""
    roll.p = 1.0
    pipeline = A.Compose([roll], strict=True, save_applied_params=True, seed=0)
    image = np.zeros((size, size, 1), np.uint8)
    out = []
    for _ in range(draws):
        params = pipeline(image=image)["applied_transforms"][0][1]
        out.append((params["dy"], params["dx"]))
    return np.array(out)


def _rolls(recipe: str) -> dict[str, RandomRoll]:
    return {t.axis: t for t in _walk(RECIPES[recipe].build()) if isinstance(t, RandomRoll)}


def test_release_roll_ranges_match_the_release_config() -> None:
    release, official = _rolls("release"), _rolls("official")
    both = _roll_offsets(release["vh"])
    assert both[:, 1].min() == 0 and both[:, 1].max() == RELEASE_ROLL_VH_MAX_DX == 10  # [0, 10] inclusive
    assert both[:, 0].max() == RELEASE_ROLL_MAX == 80  # randint(0, 80): 80 occurs (the same shift as 0)
    horizontal = _roll_offsets(release["h"])
    assert (horizontal[:, 0] == 0).all() and horizontal[:, 1].max() == 80
    vertical = _roll_offsets(release["v"])
    assert (vertical[:, 1] == 0).all() and vertical[:, 0].max() == 80
    full = _roll_offsets(official["vh"])
    assert full[:, 1].max() == 79 and full[:, 0].max() == 79  # rpm_lib: [0, S) on both axes
    assert full[:, 1].max() > 10  # the difference the release recipe exists for


def test_release_augmenter_runs_and_is_reproducible() -> None:
    rng = np.random.default_rng(0)
    panels = rng.integers(0, 256, (16, 24, 24), dtype=np.uint8)
    first = [RpmAugment("release", seed=5)(panels) for _ in range(2)]
    assert np.array_equal(first[0], first[1])
    aug = RpmAugment("release", seed=1, p=1.0)
    names = set()
    for _ in range(200):
        aug(panels, preserve_position=True)
        names.update(a.name for a in aug.last_applied)
    assert names and not names & {"grid2", "grid3", "roll_v", "roll_h", "roll_vh"}


@pytest.mark.parametrize("bad", [-1, 2.5, True, "10"])
def test_roll_limits_must_be_non_negative_ints(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_dx\n.*(greater than or equal to 0|valid integer)"):
        RandomRoll(axis="h", max_dx=bad)  # type: ignore[arg-type]
