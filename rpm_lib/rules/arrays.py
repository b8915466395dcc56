"""Validation of label arrays shared by the RAVEN and PGM encoders: a 0/1 array of a given shape, and the
active entries of a label or prediction vector. Each raises ``ValueError`` naming the array.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _binary_array(array: np.ndarray | Sequence, name: str, ndim: int, width: int) -> np.ndarray:
    """``array`` as a uint8 0/1 array with ``ndim`` dims whose last dim is ``width``; ValueError otherwise."""
    arr = np.asarray(array)
    if arr.ndim != ndim or arr.shape[-1] != width:
        raise ValueError(f"{name}: expected {ndim} dims with last dim {width}, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name}: expected a numeric 0/1 array, got dtype {arr.dtype}")
    if arr.size and not ((arr == 0) | (arr == 1)).all():
        raise ValueError(f"{name}: values must be 0 or 1, got {sorted(set(np.unique(arr).tolist()))}")
    return arr.astype(np.uint8)


def _active(vector: np.ndarray | Sequence, dim: int, name: str, threshold: float) -> np.ndarray:
    """Indices of the entries of a 1-D length-``dim`` vector that exceed ``threshold``."""
    vec = np.asarray(vector, dtype=np.float64)
    if vec.shape != (dim,):
        raise ValueError(f"{name}: expected a vector of shape ({dim},), got {vec.shape}")
    return np.flatnonzero(vec > threshold)
