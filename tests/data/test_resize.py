"""rpm_lib.data.resize: area averaging (exact 2x2 mean for 160 -> 80) and stride subsampling."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from rpm_lib.data.resize import resize_panels


def reference_area(panels: np.ndarray, size: int) -> np.ndarray:
    """OpenCV INTER_AREA on float, rounded half up (the documented definition)."""
    out = [cv2.resize(p.astype(np.float32), (size, size), interpolation=cv2.INTER_AREA) for p in panels]
    return np.floor(np.stack(out) + 0.5).astype(np.uint8)


@pytest.fixture
def panels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(16, 160, 160), dtype=np.uint8)


@pytest.mark.parametrize("size", [80, 40, 32, 64, 100])
def test_area_equals_opencv_area_on_float(panels, size):
    out = resize_panels(panels, size)
    assert out.dtype == np.uint8 and out.shape == (16, size, size) and out.flags.c_contiguous
    assert np.array_equal(out, reference_area(panels, size))


def test_area_80_is_the_rounded_2x2_mean(panels):
    mean = panels.astype(np.float64).reshape(16, 80, 2, 80, 2).mean(axis=(2, 4))
    assert np.array_equal(resize_panels(panels, 80), np.floor(mean + 0.5).astype(np.uint8))


def test_area_rounds_half_up():
    block = np.array([[0, 1], [0, 1]], dtype=np.uint8)  # mean 0.5
    out = resize_panels(np.tile(block, (16, 1, 1)), 1)
    assert out.shape == (16, 1, 1) and (out == 1).all()


def test_stride_keeps_every_second_pixel(panels):
    assert np.array_equal(resize_panels(panels, 80, "stride"), panels[:, ::2, ::2])


def test_same_size_is_a_no_op_and_bad_sizes_raise(panels):
    assert resize_panels(panels, 160) is panels
    with pytest.raises(ValueError, match="only downscaling"):
        resize_panels(panels, 320)
    with pytest.raises(ValueError, match="integer factor"):
        resize_panels(panels, 100, "stride")
    with pytest.raises(ValueError, match="unknown resize"):
        resize_panels(panels, 80, "bilinear")
    with pytest.raises(ValueError, match="uint8"):
        resize_panels(panels.astype(np.float32), 80)
