"""Downscaling the 16 panels of a problem (160 -> 80 px by default).

``"area"`` (default): area averaging, i.e. for an integer factor f the exact mean of each f x f block
(= OpenCV ``INTER_AREA`` on float), rounded half up to uint8. ``"stride"``: keep every f-th pixel
(``panels[:, ::f, ::f]``), what the official MLCL code does for PGM (parity option; it aliases thin lines).
"""
from __future__ import annotations

import cv2
import numpy as np

RESIZE_METHODS: tuple[str, ...] = ("area", "stride")


def check_resize(method: str) -> str:
    if method not in RESIZE_METHODS:
        raise ValueError(f"unknown resize method {method!r}; expected one of {list(RESIZE_METHODS)}")
    return method


def resize_panels(panels: np.ndarray, size: int, method: str = "area") -> np.ndarray:
    """Resize a panel stack.

    Args:
        panels: uint8 (P, H, H) (P = 16 for a problem).
        size: output side in px, 1 <= size <= H.
        method: ``"area"`` or ``"stride"`` (stride needs H % size == 0).

    Returns:
        uint8 (P, size, size), C-contiguous; ``panels`` itself when ``size == H``.
    """
    check_resize(method)
    if panels.ndim != 3 or panels.shape[1] != panels.shape[2] or panels.dtype != np.uint8:
        raise ValueError(f"expected uint8 panels (P, H, H), got {panels.dtype} {panels.shape}")
    side = panels.shape[1]
    if not 1 <= size <= side:
        raise ValueError(f"cannot resize {side} px panels to {size} px (only downscaling, size >= 1)")
    if size == side:
        return panels
    factor, remainder = divmod(side, size)
    if method == "stride":
        if remainder:
            raise ValueError(f"stride resize needs an integer factor; {side} px is not a multiple of {size} px")
        return np.ascontiguousarray(panels[:, ::factor, ::factor])
    if remainder == 0:
        return _block_mean(panels, factor)
    # Non-integer factor: OpenCV's area resampling (per panel: it takes at most 4 channels here).
    resized = np.stack(
        [cv2.resize(panel.astype(np.float32), (size, size), interpolation=cv2.INTER_AREA) for panel in panels]
    )
    return np.clip(np.floor(resized + 0.5), 0, 255).astype(np.uint8)


def _block_mean(panels: np.ndarray, factor: int) -> np.ndarray:
    """Exact mean of each factor x factor block, rounded half up ((sum + half) // count = floor(mean + 0.5)).

    Summing strided slices in a wide integer type is ~20x faster than ``reshape(...).sum(axis=(2, 4))``.
    """
    count = factor * factor
    wide = np.uint16 if count * 255 + count // 2 <= np.iinfo(np.uint16).max else np.uint32
    p, side = panels.shape[0], panels.shape[1]
    size = side // factor
    rows = panels.reshape(p, size, factor, side)
    row_sums = rows[:, :, 0, :].astype(wide)
    for i in range(1, factor):
        row_sums += rows[:, :, i, :]
    cols = row_sums.reshape(p, size, size, factor)
    sums = cols[..., 0].copy()
    for i in range(1, factor):
        sums += cols[..., i]
    sums += count // 2
    sums //= count
    return sums.astype(np.uint8)
