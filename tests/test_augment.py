"""Tests for rpm_lib.augment: one transform for all 16 panels, recipes, seeding, DataLoader workers."""
from __future__ import annotations

import math
import pickle
from collections import Counter

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from rpm_lib.augment import (
    RECIPES,
    ROTATION_LIMIT_DEG,
    SINGLE_TRANSFORM_NAMES,
    RpmAugment,
    single_transform,
)

POSITION_MOVING = {"grid2", "grid3", "roll_v", "roll_h", "roll_vh"}
POSITION_KEEPING = {"vflip", "hflip", "rot90", "rotate", "transpose"}


def distinct_panels(size: int, seed: int = 0) -> np.ndarray:
    """uint8 (16, size, size): white canvases with random black boxes; no two panels are equal."""
    rng = np.random.default_rng(seed)
    panels = np.full((16, size, size), 255, np.uint8)
    for k in range(16):
        for _ in range(3):
            y, x = rng.integers(0, size - 4, 2)
            h, w = rng.integers(2, size // 3, 2)
            panels[k, y : y + h, x : x + w] = rng.integers(0, 200)
        panels[k, k % size, :] = 17 * (k % 15)  # a unique stripe per panel
    assert len({p.tobytes() for p in panels}) == 16
    return panels


def reference_single_panel(panel: np.ndarray, name: str, params: dict) -> np.ndarray:
    """Apply the recorded transform to ONE (S, S) panel with plain numpy / OpenCV."""
    if name == "vflip":
        return panel[::-1, :]
    if name == "hflip":
        return panel[:, ::-1]
    if name == "transpose":
        return panel.T
    if name == "rot90":
        return np.rot90(panel, params["factor"])
    if name == "rotate":
        s = panel.shape[0]
        return cv2.warpAffine(
            panel, params["matrix"][:2], (s, s), flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT, borderValue=255,
        )
    if name.startswith("roll"):
        return np.roll(panel, (params["dy"], params["dx"]), axis=(0, 1))
    if name.startswith("grid"):
        out = np.empty_like(panel)
        tiles = params["tiles"]
        for i, src in enumerate(params["mapping"]):
            y0, x0, y1, x1 = tiles[src]
            sy0, sx0, sy1, sx1 = tiles[i]
            out[y0:y1, x0:x1] = panel[sy0:sy1, sx0:sx1]
        return out
    raise AssertionError(name)


@pytest.mark.parametrize("size", [24, 80])
@pytest.mark.parametrize("name", SINGLE_TRANSFORM_NAMES)
def test_every_panel_gets_the_same_transform(name: str, size: int) -> None:
    panels = distinct_panels(size)
    aug = single_transform(name, seed=size)
    for _ in range(4):
        out = aug(panels)
        assert out.shape == panels.shape and out.dtype == np.uint8
        assert [a.name for a in aug.last_applied] == [name]
        params = aug.last_applied[0].params
        for k in range(16):
            expected = reference_single_panel(panels[k], name, params)
            assert np.array_equal(out[k], expected), f"{name}: panel {k} differs from the recorded transform"


@pytest.mark.parametrize("name", SINGLE_TRANSFORM_NAMES)
def test_replaying_the_seed_on_one_panel_matches_the_stack(name: str) -> None:
    # Same seed -> same draw; a lone panel must then come out exactly as its channel in the 16-stack.
    panels = distinct_panels(30)
    stacked = single_transform(name, seed=5)
    for k in (0, 7, 15):
        alone = single_transform(name, seed=5)
        stacked.reseed(5)
        for _ in range(3):
            assert np.array_equal(stacked(panels)[k], alone(panels[k : k + 1])[0])


@pytest.mark.parametrize("name", ["grid2", "grid3", "roll_v", "roll_h", "roll_vh"])
def test_grid_shuffle_and_roll_keep_each_panels_pixels(name: str) -> None:
    panels = distinct_panels(80)
    aug = single_transform(name, seed=1)
    moved = 0
    for _ in range(5):
        out = aug(panels)
        moved += not np.array_equal(out, panels)
        for k in range(16):
            assert np.array_equal(np.sort(out[k], axis=None), np.sort(panels[k], axis=None))
    assert moved > 0


def test_rotation_fills_corners_with_white() -> None:
    panels = np.zeros((16, 40, 40), np.uint8)  # all black: any white pixel comes from the fill
    aug = single_transform("rotate", seed=0)
    checked = 0
    for _ in range(20):
        out = aug(panels)
        angle = aug.last_applied[0].params["angle"]
        assert abs(angle) <= ROTATION_LIMIT_DEG + 1e-9
        if 10 <= abs(angle) <= 80:  # corners land well outside the rotated canvas
            for corner in (out[:, 0, 0], out[:, 0, -1], out[:, -1, 0], out[:, -1, -1]):
                assert (corner == 255).all()
            checked += 1
    assert checked >= 5


def test_position_preserving_recipe_is_used_when_asked() -> None:
    panels = distinct_panels(12)
    aug = RpmAugment("official", seed=0)
    assert aug.position_recipe.name == "position_preserving"
    seen_preserving: set[str] = set()
    seen_free: set[str] = set()
    for _ in range(300):
        aug(panels, preserve_position=True)
        seen_preserving.update(a.name for a in aug.last_applied)
        aug(panels, preserve_position=False)
        seen_free.update(a.name for a in aug.last_applied)
    assert seen_preserving == POSITION_KEEPING  # all of them occur, and nothing else
    assert POSITION_MOVING <= seen_free  # the same augmenter does shuffle / roll without the flag


def test_single_moving_transform_is_skipped_when_positions_must_stay() -> None:
    panels = distinct_panels(12)
    roll = single_transform("roll_vh", seed=0)
    assert np.array_equal(roll(panels, preserve_position=True), panels) and roll.last_applied == []
    flip = single_transform("vflip", seed=0)
    assert np.array_equal(flip(panels, preserve_position=True), panels[:, ::-1, :])


def test_official_probabilities_and_independence() -> None:
    # Official recipe: pipeline p=0.5; five transforms p=0.25; OneOf grid p=0.25; OneOf roll p=0.5 with
    # weights 0.4/0.3/0.3. Also checks draws are independent: with albumentations' Compose(seed=...),
    # vflip and hflip would always co-occur (rate 0.125 instead of 0.5 * 0.25**2).
    panels = distinct_panels(12)
    aug = RpmAugment("official", seed=123)
    n = 3000
    counts: Counter[str] = Counter()
    untouched = both_flips = 0
    for _ in range(n):
        aug(panels)
        names = [a.name for a in aug.last_applied]
        counts.update(names)
        untouched += not names
        both_flips += "vflip" in names and "hflip" in names
    expected = {name: 0.5 * 0.25 for name in POSITION_KEEPING}
    expected |= {"grid2": 0.5 * 0.25 * 0.5, "grid3": 0.5 * 0.25 * 0.5}
    expected |= {"roll_vh": 0.5 * 0.5 * 0.4, "roll_h": 0.5 * 0.5 * 0.3, "roll_v": 0.5 * 0.5 * 0.3}
    nothing_inside = 0.75**6 * 0.5
    observed = {**{k: counts[k] / n for k in expected}, "untouched": untouched / n, "both": both_flips / n}
    targets = {**expected, "untouched": 0.5 + 0.5 * nothing_inside, "both": 0.5 * 0.25**2}
    for key, target in targets.items():
        sigma = math.sqrt(target * (1 - target) / n)
        assert abs(observed[key] - target) < 4.5 * sigma, (key, observed[key], target)


def test_p_override() -> None:
    panels = distinct_panels(12)
    never = RpmAugment("official", seed=0, p=0.0)
    assert all(np.array_equal(never(panels), panels) for _ in range(20))
    always = RpmAugment("official", seed=0, p=1.0)
    applied = 0
    for _ in range(200):
        always(panels)
        applied += bool(always.last_applied)
    assert applied > 170  # P(nothing inside) = 0.75**6 * 0.5 ~ 0.09


def test_none_recipe_is_identity_copy() -> None:
    panels = distinct_panels(12)
    out = RpmAugment("none", seed=0)(panels, preserve_position=True)
    assert np.array_equal(out, panels) and out is not panels


def test_same_seed_same_outputs_and_reseed_restarts() -> None:
    panels = distinct_panels(20)
    a, b, c = RpmAugment(seed=7), RpmAugment(seed=7), RpmAugment(seed=8)
    first = [a(panels, preserve_position=i % 3 == 0) for i in range(30)]
    assert all(np.array_equal(x, b(panels, preserve_position=i % 3 == 0)) for i, x in enumerate(first))
    assert any(not np.array_equal(x, c(panels, preserve_position=i % 3 == 0)) for i, x in enumerate(first))
    assert len({x.tobytes() for x in first}) > 10  # the stream advances per call
    a.reseed(7)
    assert all(np.array_equal(x, a(panels, preserve_position=i % 3 == 0)) for i, x in enumerate(first))


def test_default_seed_follows_torch_manual_seed() -> None:
    torch.manual_seed(11)
    first = RpmAugment()
    torch.manual_seed(11)
    second = RpmAugment()
    torch.manual_seed(12)
    third = RpmAugment()
    assert first.seed == second.seed != third.seed


def test_pickled_augmenter_continues_the_same_stream() -> None:
    panels = distinct_panels(16)
    aug = RpmAugment(seed=3)
    aug(panels)
    clone = pickle.loads(pickle.dumps(aug))
    assert all(np.array_equal(aug(panels), clone(panels)) for _ in range(20))


class RpmDataset(Dataset):
    """Every item is the same RPM, so any difference between items comes from augmentation."""

    def __init__(self, panels: np.ndarray, transform: RpmAugment, length: int = 8):
        self.panels, self.transform, self.length = panels, transform, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return {"panels": torch.from_numpy(self.transform(self.panels, False)), "index": index}


def run_loader(seed: int, worker_init_fn, epochs: int = 2) -> list[list[torch.Tensor]]:
    """Per epoch, the list of batches (B=2, so worker 0 makes batches 0, 2 and worker 1 batches 1, 3)."""
    torch.manual_seed(seed)
    dataset = RpmDataset(distinct_panels(16), RpmAugment("official", p=1.0))
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=worker_init_fn)
    return [[batch["panels"] for batch in loader] for _ in range(epochs)]


def test_dataloader_without_worker_seeding_repeats_streams() -> None:
    # The albumentations pitfall that makes rpm_lib.data reseed the augmenter for every sample
    # (tests/training/test_training_data.py checks that workers then agree with one process).
    torch.set_num_threads(1)
    run = run_loader(0, None)
    assert torch.equal(run[0][0], run[0][1])  # worker 0 and worker 1 make the same augmentations
    assert torch.equal(torch.cat(run[0]), torch.cat(run[1]))  # and every epoch repeats


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((16, 20, 21), np.uint8),
        np.zeros((20, 20, 16), np.uint8),
        np.zeros((20, 20), np.uint8),
        np.zeros((16, 2, 2), np.uint8),
        np.zeros((16, 20, 20), np.float32),
    ],
    ids=["not-square", "channels-last", "2d", "too-small", "float"],
)
def test_bad_panels_raise_value_error(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="RpmAugment expects"):
        RpmAugment(seed=0)(bad)


def test_tensor_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="np.ndarray"):
        RpmAugment(seed=0)(torch.zeros(16, 20, 20, dtype=torch.uint8))


def test_bad_names_and_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown augmentation recipe 'offical'.*official"):
        RpmAugment("offical")
    with pytest.raises(ValueError, match="unknown transform 'roll'"):
        single_transform("roll")
    with pytest.raises(ValueError, match="p must be"):
        RpmAugment(p=1.5)
    with pytest.raises(ValueError, match="seed"):
        RpmAugment(seed=-1)


def test_recipe_registry() -> None:
    assert {"official", "position_preserving", "none"} <= set(RECIPES)
    assert RECIPES["official"].position_fallback == "position_preserving"
    assert RECIPES["position_preserving"].position_fallback is None
