"""Data for training: dataset construction and deterministic sampling (torch only: a notebook that reads a
run's test split imports this module without Lightning; :mod:`rpm_lib.training.datamodule` builds on it).

Exact resume needs every random choice to be a pure function of ``(seed, epoch, index)``, whatever the
number of DataLoader workers and whether the run was interrupted. So:

* :class:`EpochSampler` yields ``(epoch, position)`` keys: the epoch's order is a seeded permutation of
  ``(seed, epoch)``, sharded over DDP ranks (padded like ``DistributedSampler``);
* :class:`SeededSamples` wraps a ``RavenDataset`` / ``PgmDataset`` built with ``answer_order="none"``
  (training) and, for key ``(epoch, position)``, reseeds the augmenter from ``(seed, epoch, index)``
  before reading and then shuffles the answers with a permutation drawn from ``(seed, epoch, index)``.
  Shuffling after the augmentation is equivalent to before: the augmentation applies one geometric
  transform to every panel, so it commutes with reordering panels.
  Validation / test sets use the dataset's ``answer_order="fixed"`` (a function of ``(seed, source_id)``).

A time-boxed run (``rpm_lib.training.time_budget``) may stop in the middle of an epoch: the training loader is a
:class:`ResumableLoader`, whose position in the epoch goes into the checkpoint (Lightning saves and restores
loaders that have ``state_dict`` / ``load_state_dict``), so a resumed epoch yields exactly the batches an
uninterrupted one would still have yielded.

Batches are dicts: ``panels`` uint8 (B, 16, S, S) or (B, V, 16, S, S), ``target`` int64 (B,), ``rules``
float32 (B, R) in the configured encoding, ``configuration`` int64 (B,), ``index`` int64 (B,) (dataset
index), ``source_id`` list[str].
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler

from rpm_lib import rules
from rpm_lib.data.seeding import derive_seed
from rpm_lib.training.config import ConfigError, TrainConfig

_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


# ----------------------------------------------------------------------------------------------
# datasets
# ----------------------------------------------------------------------------------------------
def group_names(config: TrainConfig) -> tuple[str, ...]:
    """Names of the sample key ``configuration``: RAVEN configuration folders or PGM regimes."""
    return rules.CONFIGURATIONS if config.dataset == "iraven" else rules.PGM_REGIMES


def make_dataset(config: TrainConfig, split: str, *, num_views: int = 1, transform: Any = None,
                 answer_order: str | None = None, root: str | Path | None = None) -> Dataset:
    """The ``rpm_lib.data`` dataset of ``split`` for ``config`` (raw folder or cache, detected by the reader).

    ``root``: another folder read with the run's settings (an extra test set); default ``config.data_root``.
    """
    from rpm_lib.data import PgmDataset, RavenDataset

    if root is not None:
        root = Path(root)
        if not root.exists():
            raise ConfigError(f"config field 'test_data_roots': {root} does not exist")
    else:
        root = Path(config.data_root)
        if not root.exists():
            raise ConfigError(f"config field 'data_root': {root} does not exist (set generate=true to create a "
                              "small I-RAVEN there, or point it at a dataset / cache)")
    layout = config.rule_spec.dataset_layout
    common = dict(image_size=config.image_size, answer_order=answer_order, seed=config.seed, transform=transform,
                  num_views=num_views)
    if config.dataset == "iraven":
        return RavenDataset(root, split, configurations=config.configurations, rule_encoding=layout, **common)
    return PgmDataset(root, config.pgm_regime, split, rule_encoding=layout, **common)


class SeededSamples(Dataset):
    """The batches' view of a dataset: a subset of positions, the run's rule vector as ``rules``, and the
    ``(epoch, index)`` key passed through, so the dataset's answer order and augmentation are pure functions of
    ``(seed, epoch, index)`` (see ``RpmDataset.__getitem__``).

    Args:
        base: ``RavenDataset`` / ``PgmDataset`` (training: ``answer_order="random"``, the stage's augmenter as
            ``transform``; evaluation: ``"fixed"``, no transform).
        rule_key: ``"rules_sparse"`` or ``"rules_dense"``, copied to the batch key ``rules``.
        positions: dataset indices this view exposes (``None`` = all), e.g. a ``max_train_samples`` subset.

    Item key: ``(epoch, position)`` from :class:`EpochSampler`, or a plain ``position`` (epoch 0).
    """

    def __init__(self, base: Dataset, rule_key: str, positions: np.ndarray | None = None) -> None:
        self.base = base
        self.rule_key = rule_key
        self.positions = None if positions is None else np.asarray(positions, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.base) if self.positions is None else len(self.positions)  # type: ignore[arg-type]

    def dataset_index(self, position: int) -> int:
        return int(position) if self.positions is None else int(self.positions[position])

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        epoch, position = key if isinstance(key, tuple) else (0, key)
        sample = self.base[(int(epoch), self.dataset_index(position))]
        return {
            "panels": sample["panels"],
            "target": sample["target"],
            "rules": sample[self.rule_key],
            "configuration": int(sample["configuration"]),
            "index": int(sample["index"]),
            "source_id": sample["source_id"],
        }


def subset_positions(length: int, limit: int | None, seed: int, split: str) -> np.ndarray | None:
    """Sorted seeded random subset of ``limit`` positions out of ``length`` (``None``: keep all)."""
    if limit is None or limit >= length:
        return None
    rng = np.random.default_rng(derive_seed(seed, "subset", _SPLIT_CODES[split]))
    return np.sort(rng.choice(length, size=limit, replace=False))


# ----------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------
class EpochSampler(Sampler):
    """Yields ``(epoch, position)`` keys; the order is a function of ``(seed, epoch)`` only.

    Args:
        num_samples: dataset length.
        seed: master seed.
        shuffle: permute every epoch (training); otherwise the natural order and epoch key 0.
        rank, world_size: DDP shard: rank r takes every ``world_size``-th key of the (padded) order.
        pad: repeat the first keys so every rank gets the same count (needed by DDP collectives).

    Lightning calls :meth:`set_epoch` at the start of every epoch (also after a resume).
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool, rank: int = 0, world_size: int = 1,
                 pad: bool = True) -> None:
        if num_samples < 1:
            raise ValueError("EpochSampler: the dataset is empty")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, keys to skip) of a resumed, unfinished epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume_at(self, epoch: int, skip: int) -> None:
        """The next iteration over ``epoch`` starts after its first ``skip`` keys (of this rank's shard)."""
        self._resume = (int(epoch), int(skip)) if skip > 0 else None

    def _local_count(self) -> int:
        if self.pad:
            return math.ceil(self.num_samples / self.world_size)
        return len(range(self.rank, self.num_samples, self.world_size))

    def __len__(self) -> int:
        return self._local_count()

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch if self.shuffle else 0
        if self.shuffle:
            order = np.random.default_rng(derive_seed(self.seed, "sampler", epoch)).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        if self.pad and self.world_size > 1:
            total = self._local_count() * self.world_size
            order = np.resize(order, total)  # np.resize repeats from the start
        shard = order[self.rank::self.world_size]
        if self._resume is not None and self._resume[0] == epoch:
            shard = shard[self._resume[1]:]
        self._resume = None
        for position in shard:
            yield epoch, int(position)


class ResumableLoader(DataLoader):
    """A training ``DataLoader`` over an :class:`EpochSampler` that knows its position in the epoch.

    Lightning saves ``state_dict()`` in every checkpoint and calls ``load_state_dict`` when it resumes one.
    The position is the number of batches the trainer finished in the current epoch, asked from
    ``batches_done`` at save time (batches a worker has prefetched are not finished, so the loader cannot
    count them itself).

    Args:
        batches_done: returns the finished batches of the current epoch (``None``: the state is empty).
        *args, **kwargs: as ``DataLoader``; ``sampler`` must be an :class:`EpochSampler`.
    """

    def __init__(self, *args: Any, batches_done: Callable[[], int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches_done = batches_done

    def state_dict(self) -> dict[str, int]:
        if self.batches_done is None:
            return {}
        return {"epoch": int(self.sampler.epoch), "batches_done": int(self.batches_done())}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state:
            assert self.batch_size is not None
            self.sampler.resume_at(state["epoch"], state["batches_done"] * self.batch_size)
