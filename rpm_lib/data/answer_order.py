"""Order of the 8 answer choices presented to a model.

* ``"random"``: a new uniformly random permutation at every access (training). The generator is seeded
  from ``seed`` and, inside a DataLoader worker, the worker's torch seed, so workers draw different
  streams and a run with the same seeds repeats exactly.
* ``"fixed"``: one permutation per problem derived from ``(seed, source_id)`` with a stable hash (BLAKE2b,
  not Python's salted ``hash``), so evaluation is reproducible across processes, machines and cache vs raw
  reading, and the correct answer's position is uniform over 0..7.
* ``"none"``: file order.

A permutation ``perm`` (int64 (8,)) maps new position i to old choice ``perm[i]``.
"""
from __future__ import annotations

import hashlib
import math
import os

import numpy as np

ANSWER_ORDERS: tuple[str, ...] = ("random", "fixed", "none")
NUM_CHOICES = 8


def default_answer_order(split: str) -> str:
    """``"random"`` for train, ``"fixed"`` for val/test."""
    return "random" if split == "train" else "fixed"


def fixed_permutation(seed: int, source_id: str) -> np.ndarray:
    """int64 (8,): the permutation of problem ``source_id`` under ``seed`` (uniform over all 8!)."""
    digest = hashlib.blake2b(f"{seed}\x00{source_id}".encode(), digest_size=16).digest()
    # A 128-bit number modulo 8! is uniform up to a 2^-112 bias; unrank it as a Lehmer code.
    rank = int.from_bytes(digest, "little") % math.factorial(NUM_CHOICES)
    items = list(range(NUM_CHOICES))
    perm = []
    for k in range(NUM_CHOICES, 0, -1):
        index, rank = divmod(rank, math.factorial(k - 1))
        perm.append(items.pop(index))
    return np.array(perm, dtype=np.int64)


def apply_permutation(panels: np.ndarray, target: int, perm: np.ndarray) -> tuple[np.ndarray, int]:
    """Reorder the choices of a (..., 16, S, S) stack: new choice i = old choice ``perm[i]``.

    Returns a new array and the new target (where the old correct choice went).
    """
    choices = panels[..., 8:, :, :][..., perm, :, :]
    out = np.concatenate([panels[..., :8, :, :], choices], axis=-3)
    return out, int(np.flatnonzero(perm == target)[0])


class AnswerOrder:
    """Permutation source for one dataset (see the module docstring for the modes)."""

    def __init__(self, mode: str, seed: int = 0) -> None:
        if mode not in ANSWER_ORDERS:
            raise ValueError(f"unknown answer_order {mode!r}; expected one of {list(ANSWER_ORDERS)}")
        self.mode = mode
        self.seed = int(seed)
        self._rng: np.random.Generator | None = None
        self._rng_owner: tuple[int, int] | None = None

    def _random_generator(self) -> np.random.Generator:
        # Re-seed whenever we are in a new process or DataLoader worker, so forked copies of the dataset
        # never replay the same stream.
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        owner = (os.getpid(), info.seed if info is not None else -1)
        if self._rng is None or owner != self._rng_owner:
            stream = [self.seed] if info is None else [self.seed, info.seed]
            self._rng = np.random.default_rng(stream)
            self._rng_owner = owner
        return self._rng

    def permutation(self, source_id: str) -> np.ndarray | None:
        """int64 (8,) for ``source_id``, or None for ``"none"``."""
        if self.mode == "none":
            return None
        if self.mode == "fixed":
            return fixed_permutation(self.seed, source_id)
        return self._random_generator().permutation(NUM_CHOICES)

    def __getstate__(self) -> dict:
        return {"mode": self.mode, "seed": self.seed, "_rng": None, "_rng_owner": None}
