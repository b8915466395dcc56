"""Data for training: dataset construction, deterministic sampling, and the LightningDataModule.

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

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from rpm_lib import rules
from rpm_lib.data.seeding import derive_seed
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.feature_cache import IndexOnly
from rpm_lib.training.setups import StagePlan

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


# ----------------------------------------------------------------------------------------------
# the DataModule
# ----------------------------------------------------------------------------------------------
class RpmDataModule(L.LightningDataModule):
    """Train / val / test data of one stage.

    Args:
        config: the run configuration.
        plan: the stage (batch size, number of views, augmentation recipe).
        fingerprint: called with ``data_root`` once the data exist (after generation), before training reads
            them: ``train`` records the data's fingerprint there, or refuses data other than a resumed run's.
    """

    def __init__(self, config: TrainConfig, plan: StagePlan,
                 fingerprint: Callable[[str | Path], Any] | None = None) -> None:
        super().__init__()
        self.config = config
        self.plan = plan
        self.fingerprint = fingerprint
        self.rule_key = config.rule_spec.sample_key
        self.train_set: SeededSamples | None = None
        self.val_set: SeededSamples | None = None
        self._recalibration_set: Dataset | None = None
        #: Set by the module when it trains on cached embeddings: the train / val batches carry only ``index``.
        self.index_only = False

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node before the others read the folder.
        from rpm_lib.training.generation import ensure_generated

        ensure_generated(self.config)

    def make_split(self, split: str, *, training: bool = False, root: str | Path | None = None,
                   answer_order: str | None = None) -> SeededSamples:
        """The view of ``split``: training = this stage's views + augmentation and seeded answer shuffling.

        ``root``: read ``split`` of another folder (an extra test set) instead of ``data_root``. ``answer_order``:
        instead of ``random`` (training) / ``fixed`` (evaluation), e.g. ``none`` for the files' order.
        """
        cfg = self.config
        limit = {"train": cfg.max_train_samples, "val": cfg.max_val_samples, "test": cfg.max_test_samples}[split]
        augmenter = None
        if training and self.plan.augment != "none":
            from rpm_lib.augment import RpmAugment

            augmenter = RpmAugment(self.plan.augment, seed=cfg.seed, save_applied_params=False)
        base = make_dataset(cfg, split, num_views=self.plan.num_views if training else 1, transform=augmenter,
                            answer_order=answer_order or ("random" if training else "fixed"), root=root)
        if len(base) == 0:
            field = "data_root" if root is None else "test_data_roots"
            raise ConfigError(f"config field '{field}': no {split} problems found in {root or cfg.data_root}")
        positions = subset_positions(len(base), limit, cfg.seed, split)
        return SeededSamples(base, self.rule_key, positions)

    def setup(self, stage: str | None = None) -> None:
        if self.fingerprint is not None:
            self.fingerprint(self.config.data_root)
        if self.train_set is None:
            self.train_set = self.make_split("train", training=True)
            self.val_set = self.make_split("val")
            # The test split is read only after the last stage: find out now that it is missing, not hours later.
            if len(make_dataset(self.config, "test")) == 0:
                raise ConfigError(f"config field 'data_root': no test problems found in {self.config.data_root}")

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool, rank: int, world: int,
                batches_done: Callable[[], int] | None = None) -> DataLoader:
        sampler = EpochSampler(len(dataset), self.config.seed, shuffle=shuffle, rank=rank, world_size=world)
        # A size-1 last batch breaks BatchNorm1d in train mode; drop the ragged end when there is more than one batch.
        drop_last = shuffle and len(sampler) > batch_size
        # index-only batches read nothing: worker processes would only add start-up time
        workers = 0 if isinstance(dataset, IndexOnly) else self.config.num_workers
        common = dict(batch_size=batch_size, sampler=sampler, drop_last=drop_last, num_workers=workers,
                      persistent_workers=workers > 0, pin_memory=_pin_memory(self.config))
        if batches_done is not None:
            return ResumableLoader(dataset, batches_done=batches_done, **common)
        return DataLoader(dataset, **common)

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None
        rank, world = self._world()
        dataset = IndexOnly(self.train_set) if self.index_only else self.train_set
        loader = self._loader(dataset, self.plan.batch_size, True, rank, world, self._batches_done)
        if self.trainer is not None:
            # Lightning creates the first epoch's iterator before it tells the sampler the epoch; worker processes
            # then fetch their first indices at once. A resumed run must not fetch epoch 0's order for epoch e.
            loader.sampler.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)
        return loader

    def _batches_done(self) -> int:
        """Training batches the trainer has finished in its current epoch (asked when a checkpoint is written)."""
        assert self.trainer is not None
        # The time budget writes its checkpoint in on_train_batch_end, before Lightning counts the batch as
        # completed; `processed` already counts it there, and equals `completed` at an epoch's end.
        return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        rank, world = self._world()
        dataset = IndexOnly(self.val_set) if self.index_only else self.val_set
        return self._loader(dataset, self.plan.batch_size, False, rank, world)

    def feature_loader(self, split: str) -> DataLoader:
        """The problems of this stage's ``train`` or ``val`` view (the same subset), un-augmented, one view, in file
        answer order, in dataset order: what the feature cache embeds (:mod:`rpm_lib.training.feature_cache`)."""
        return DataLoader(self.make_split(split, answer_order="none"), batch_size=self.plan.batch_size, shuffle=False,
                          num_workers=self.config.num_workers, pin_memory=_pin_memory(self.config))

    def bn_recalibration_loader(self) -> DataLoader:
        """Un-augmented single-view training problems for re-estimating BatchNorm statistics
        (``config.bn_recalibration_batches`` batches of the stage's batch size, fewer when the split is smaller).

        The problems are a seeded subset of the training split, the same at every call, so the statistics are a
        function of the weights only (resuming a run re-estimates exactly the same values). Every DDP process
        reads all of them, so every process computes the same statistics without communicating.
        """
        if self._recalibration_set is None:
            view = self.make_split("train")
            count = min(len(view), self.config.bn_recalibration_batches * self.plan.batch_size)
            rng = np.random.default_rng(derive_seed(self.config.seed, "bn_recalibration"))
            positions = np.sort(rng.choice(len(view), size=count, replace=False))
            self._recalibration_set = Subset(view, positions.tolist())
        return DataLoader(self._recalibration_set, batch_size=self.plan.batch_size, shuffle=False,
                          num_workers=self.config.num_workers, pin_memory=_pin_memory(self.config))

    def eval_dataloader(self, split: str, root: str | Path | None = None) -> DataLoader:
        """Unsharded loader over a whole val / test split (final evaluation runs on one process), of ``data_root``
        or of another folder ``root`` (an extra test set)."""
        return self._loader(self.make_split(split, root=root), self.plan.batch_size, False, 0, 1)


def _pin_memory(config: TrainConfig) -> bool:
    return config.trains_on_cuda
