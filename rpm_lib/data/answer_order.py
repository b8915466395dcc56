"""Order of the 8 answer choices presented to a model.

* ``"random"``: a uniformly random permutation per sample and epoch (training), a pure function of
  ``(seed, epoch, index)`` (stream ``answers`` of :func:`rpm_lib.data.seeding.derive_seed`): the same in any
  DataLoader worker, in a resumed run and on any machine, and new in every epoch.
* ``"fixed"``: one permutation per problem derived from ``(seed, source_id)`` with a stable hash (BLAKE2b,
  not Python's salted ``hash``), so evaluation is reproducible across processes, machines and cache vs raw
  reading, and the correct answer's position is uniform over 0..7.
* ``"none"``: file order.

A permutation ``perm`` (int64 (8,)) maps new position i to old choice ``perm[i]``.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from rpm_lib.data.seeding import derive_seed

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

    def permutation(self, source_id: str, epoch: int = 0, index: int = 0) -> np.ndarray | None:
        """int64 (8,) for problem ``index`` (``source_id``) in ``epoch``, or None for ``"none"``."""
        if self.mode == "none":
            return None
        if self.mode == "fixed":
            return fixed_permutation(self.seed, source_id)
        return random_permutation(self.seed, epoch, index)


def random_permutation(seed: int, epoch: int, index: int) -> np.ndarray:
    """int64 (8,): the ``"random"`` order of problem ``index`` in ``epoch`` under ``seed``."""
    return np.random.default_rng(derive_seed(seed, "answers", epoch, index)).permutation(NUM_CHOICES)
