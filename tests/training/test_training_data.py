"""Deterministic data: sampler order and shards, seeded answer shuffling and augmentation."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from rpm_lib.training.config import TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.samples import EpochSampler, make_dataset, subset_positions
from rpm_lib.training.plans import stage_plan


def test_sampler_order_is_a_function_of_seed_and_epoch() -> None:
    sampler = EpochSampler(20, seed=5, shuffle=True)
    sampler.set_epoch(3)
    first = list(sampler)
    again = EpochSampler(20, seed=5, shuffle=True)
    again.set_epoch(3)
    assert list(again) == first
    assert all(epoch == 3 for epoch, _ in first)
    assert sorted(p for _, p in first) == list(range(20))
    sampler.set_epoch(4)
    assert [p for _, p in sampler] != [p for _, p in first]
    assert list(EpochSampler(5, seed=5, shuffle=False)) == [(0, i) for i in range(5)]


def test_sampler_shards_cover_the_epoch() -> None:
    shards = []
    for rank in range(3):
        sampler = EpochSampler(10, seed=1, shuffle=True, rank=rank, world_size=3)
        sampler.set_epoch(2)
        shards.append([p for _, p in sampler])
    assert [len(s) for s in shards] == [4, 4, 4]  # padded to equal counts for DDP collectives
    assert set().union(*map(set, shards)) == set(range(10))


def test_subset_is_seeded() -> None:
    assert subset_positions(10, None, 0, "train") is None
    a = subset_positions(100, 7, 0, "train")
    assert a is not None and len(a) == 7 and np.all(np.diff(a) > 0)
    assert np.array_equal(a, subset_positions(100, 7, 0, "train"))
    assert not np.array_equal(a, subset_positions(100, 7, 0, "val"))


def _train_set(config: TrainConfig):
    datamodule = RpmDataModule(config, stage_plan(config)[0])
    datamodule.setup("fit")
    return datamodule.train_set


def test_training_samples_are_pure_functions_of_seed_epoch_index(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="mlcl_aug")
    samples = _train_set(config)
    assert samples.base.transform is not None and samples[(0, 0)]["panels"].shape[0] == 2  # two views
    # Read in different orders: the same key gives the same bytes.
    forward = [samples[(1, i)] for i in range(6)]
    backward = [samples[(1, i)] for i in reversed(range(6))][::-1]
    for a, b in zip(forward, backward):
        assert torch.equal(a["panels"], b["panels"]) and a["target"] == b["target"]
    # A fresh dataset object (a resumed run, another worker) gives the same sample too.
    other = _train_set(config)
    assert torch.equal(other[(1, 3)]["panels"], forward[3]["panels"])
    # Different epochs give different answer orders / augmentations, and the two views differ.
    targets = {int(samples[(epoch, 0)]["target"]) for epoch in range(12)}
    assert len(targets) > 1
    assert any(not torch.equal(samples[(e, 0)]["panels"][0], samples[(e, 0)]["panels"][1]) for e in range(6))


def test_answer_shuffle_keeps_the_correct_panel(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="ce")
    samples = _train_set(config)
    raw = make_dataset(config, "train", answer_order="none")[0]  # file order
    correct = raw["panels"][8 + int(raw["target"])]
    for epoch in range(4):
        sample = samples[(epoch, 0)]
        assert torch.equal(sample["panels"][8 + int(sample["target"])], correct)
        assert torch.equal(sample["panels"][:8], raw["panels"][:8])
    assert samples[(0, 0)]["rules"].shape == (38,)


def test_eval_split_uses_fixed_answer_order(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="ce_aux_dense", max_test_samples=None)
    datamodule = RpmDataModule(config, stage_plan(config)[0])
    first = next(iter(datamodule.eval_dataloader("test")))
    second = next(iter(datamodule.eval_dataloader("test")))
    assert torch.equal(first["panels"], second["panels"]) and torch.equal(first["target"], second["target"])
    assert first["rules"].shape[1] == 9  # dense rules for ce_aux_dense
    with pytest.raises(Exception, match="does not exist"):
        RpmDataModule(tiny_config(data_root="/nonexistent/rpm"), stage_plan(config)[0]).make_split("val")


def test_dataloader_workers_give_the_batches_of_one_process(tiny_config: Callable[..., TrainConfig]) -> None:
    """Answer order and augmentation come from (seed, epoch, index), so two workers read exactly what one
    process reads, epoch after epoch (no worker_init_fn, no per-worker streams)."""
    from torch.utils.data import DataLoader

    samples = _train_set(tiny_config(setup="mlcl_aug"))

    def epochs(workers: int) -> list[torch.Tensor]:
        sampler = EpochSampler(len(samples), seed=0, shuffle=True)
        loader = DataLoader(samples, batch_size=2, sampler=sampler, num_workers=workers,
                            persistent_workers=workers > 0)
        out = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            out.append(torch.cat([batch["panels"] for batch in loader]))
        return out

    one, two = epochs(0), epochs(2)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    assert not torch.equal(one[0], one[1]), "epochs differ"
