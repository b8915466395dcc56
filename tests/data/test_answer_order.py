"""rpm_lib.data.answer_order: permutation semantics, stable fixed orders, per-worker random streams."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from rpm_lib.data.answer_order import AnswerOrder, apply_permutation, default_answer_order, fixed_permutation


def test_apply_permutation_moves_the_target_with_its_image():
    panels = np.arange(16, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), dtype=np.uint8)
    perm = np.array([3, 0, 7, 1, 2, 6, 5, 4])
    out, target = apply_permutation(panels, 6, perm)
    assert np.array_equal(out[:8], panels[:8])
    assert [int(out[8 + i, 0, 0]) for i in range(8)] == [8 + p for p in perm]
    assert target == 5 and out[8 + target, 0, 0] == 8 + 6


def test_fixed_permutation_is_stable_and_seed_dependent():
    a = fixed_permutation(0, "center_single/RAVEN_8_test")
    assert sorted(a.tolist()) == list(range(8))
    assert np.array_equal(a, fixed_permutation(0, "center_single/RAVEN_8_test"))
    others = [fixed_permutation(s, "center_single/RAVEN_8_test") for s in range(1, 6)]
    assert any(not np.array_equal(a, o) for o in others)


def test_fixed_permutation_does_not_depend_on_python_hash_seed():
    code = "from rpm_lib.data.answer_order import fixed_permutation as f; print(f(7, 'x/RAVEN_1_val').tolist())"
    outputs = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert outputs == {str(fixed_permutation(7, "x/RAVEN_1_val").tolist()) + "\n"}


def test_fixed_positions_of_the_answer_are_uniform():
    counts = np.zeros(8, dtype=int)
    for k in range(8000):
        perm = fixed_permutation(0, f"distribute_four/RAVEN_{k}_test")
        counts[int(np.flatnonzero(perm == 0)[0])] += 1
    # Binomial(8000, 1/8): sd ~ 29.6; 5 sd bound
    assert np.abs(counts - 1000).max() < 150, counts


def test_modes_and_defaults():
    assert default_answer_order("train") == "random" and default_answer_order("test") == "fixed"
    assert AnswerOrder("none").permutation("a") is None
    order = AnswerOrder("random", seed=5)
    # A pure function of (seed, epoch, index): repeated calls and fresh objects agree ...
    draws = [order.permutation("a", epoch, index).tolist() for epoch in range(5) for index in range(4)]
    assert draws == [AnswerOrder("random", seed=5).permutation("a", e, i).tolist() for e in range(5) for i in range(4)]
    # ... and epochs, indices and seeds give different orders.
    assert len({tuple(d) for d in draws}) > 15
    assert draws != [AnswerOrder("random", seed=6).permutation("a", e, i).tolist() for e in range(5) for i in range(4)]
    with pytest.raises(ValueError, match="answer_order"):
        AnswerOrder("sorted")


class _Permutations(Dataset):
    def __init__(self) -> None:
        self.order = AnswerOrder("random", seed=0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.order.permutation("same problem", epoch=0, index=index))


def _draw(num_workers: int) -> list[list[int]]:
    loader = DataLoader(_Permutations(), batch_size=None, num_workers=num_workers)
    return [p.tolist() for p in loader]


def test_dataloader_workers_draw_the_same_orders_as_one_process():
    # No per-worker streams to seed: the order of sample i does not depend on which process reads it.
    assert _draw(2) == _draw(0)
    assert len({tuple(p) for p in _draw(0)}) > 4


def test_apply_permutation_on_several_views():
    views = np.random.default_rng(0).integers(0, 255, size=(2, 16, 3, 3), dtype=np.uint8)
    perm = fixed_permutation(1, "views")
    out, target = apply_permutation(views, 2, perm)
    assert out.shape == views.shape
    for v in range(2):
        single, single_target = apply_permutation(views[v], 2, perm)
        assert np.array_equal(out[v], single) and single_target == target
